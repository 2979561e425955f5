#!/usr/bin/env bash
# Run ON THE GPU HOST (one H200, no network), from the folder that holds scripts/ and verify/:
# installs the wheels staged by stage-studio-wheels.sh into /tmp/site (first on PYTHONPATH),
# records the GPU, then runs run-studio.sh. Usage: run-studio-h200.sh WHEEL_DIR OUT_DIR [STEPS]
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WHEELS=${1:?usage: run-studio-h200.sh WHEEL_DIR OUT_DIR [STEPS]}
OUT=${2:?usage: run-studio-h200.sh WHEEL_DIR OUT_DIR [STEPS]}
mkdir -p "$OUT"
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$WHEELS"/*.whl || { echo "wheel install failed"; exit 8; }
echo "installed $(ls "$WHEELS" | wc -l) wheels in $(( $(date +%s) - start )) s"
export PYTHONPATH=/tmp/site
{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } \
  >"$OUT/nvidia-smi.txt" 2>&1
PY=python3 bash "$HERE/run-studio.sh" "$OUT" "${3:-30}"
