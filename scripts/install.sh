#!/usr/bin/env bash
# Installs trainfit and its pinned dependencies into the current Python.
# torch is installed first and exactly (2.13.0, CPU build on this kind of machine): an unpinned
# torch, or a range that admits a newer one, pulls several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q torch==2.13.0
fi
$PY -m pip install -q -e ".[test,qlora,hf]"
