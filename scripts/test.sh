#!/usr/bin/env bash
# Installs trainfit with its test dependencies, then runs ruff and the test suite (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=${PYTHON:-python3}
$PY -m ruff check src tests benchmarks
$PY -m pytest tests
