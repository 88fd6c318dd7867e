#!/usr/bin/env bash
# Installs trainfit and its pinned dependencies into the current Python.
# torch is installed first and exactly (2.13.0, CPU build on this kind of machine): an unpinned
# torch, or a range that admits a newer one, pulls several GB of CUDA wheels.
# It says what it is doing at each step (a full install takes a minute or two): pip's own lines
# are shown, less the "Location ... is ignored" warnings of this machine's local package index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$SECONDS
step() { echo "[install $((SECONDS - start)) s] $*"; }
pip_install() { $PY -m pip install --progress-bar off "$@" 2>&1 | sed -u '/^WARNING: Location .* is ignored/d'; }
if ! $PY -c "import torch" 2>/dev/null; then
  step "torch 2.13.0 (exact: a newer one would pull CUDA wheels)…"
  pip_install torch==2.13.0
else
  step "torch already installed: $($PY -c 'import torch; print(torch.__version__)')"
fi
step "trainfit (editable) with transformers, peft, accelerate, bitsandbytes, trl, datasets, test tools…"
pip_install -e ".[test,qlora,hf]"
step "done: $($PY -c 'import trainfit, importlib.metadata as m; print("trainfit", m.version("trainfit"))')"
