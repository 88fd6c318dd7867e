#!/usr/bin/env bash
# Installs trainfit with its test dependencies, then runs ruff and the test suite (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=${PYTHON:-python3}
$PY -m ruff check src tests benchmarks
# reference code the tests check trainfit's models against, installed apart under build/reference
# (never imported by trainfit): torchao 0.1's and 0.18's NF4 quantizers and torchtune 0.1.1's
# model builders and LoRA step (tests/memory/test_loading.py)
for pkg in torchao==0.1 torchao==0.18.0 torchtune==0.1.1; do
  ref=build/reference/${pkg/==/-}
  [ -d "$ref" ] || $PY -m pip install -q --no-deps --target "$ref" "$pkg" 2>&1 \
    | sed -u '/^WARNING: /d' || echo "warning: $pkg not installed in $ref: its test is skipped" >&2
done
# DeepSpeed 0.19.8 (pure Python: DS_BUILD_OPS=0) and the modules it imports, run by 2 gloo ranks
# on its CPU accelerator against plan's ZeRO-2/3 terms (tests/memory/test_zero_vs_gloo.py)
ref=build/reference/deepspeed-0.19.8
[ -d "$ref" ] || DS_BUILD_OPS=0 $PY -m pip install -q --no-deps --target "$ref" deepspeed==0.19.8 \
  hjson==3.1.0 msgpack==1.2.4 py-cpuinfo==9.0.0 einops==0.8.2 2>&1 | sed -u '/^WARNING: /d' \
  || { rm -rf "$ref"; echo "warning: deepspeed not installed in $ref: its test is skipped" >&2; }
# one pytest worker per core, at most 4 (each holds torch, transformers and tiny models: ~1-2 GB);
# --dist worksteal: an idle worker takes pending tests from a busy one (a few tests take minutes).
# PYTEST_WORKERS=0 runs everything in this process.
WORKERS=${PYTEST_WORKERS:-$($PY -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}
if [ "$WORKERS" -gt 0 ]; then
  $PY -m pytest tests -n "$WORKERS" --dist worksteal --durations=25
else
  $PY -m pytest tests --durations=25
fi
