#!/usr/bin/env bash
# Run ON A 2 x H200 HOST (kind nvidia-h200-x2) from the repository root: L0 and L7 (torchrun,
# NCCL all-reduce, one DDP LoRA step) on the host's own torch/peft. Writes $OUT/l7/report.*.
set -uo pipefail
. scripts/gpu/env.sh
OUT=${OUT:-/tmp/stackpin-evidence}
mkdir -p "$OUT"
date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
nvidia-smi topo -m || true
echo "+ PYTHONPATH=verify python3 -m stackpin_verify --levels 0,7 --dtype bf16 --image-info scripts/gpu/image-h200x2.json --out-dir $OUT/l7"
PYTHONPATH=verify timeout 400 python3 -m stackpin_verify --levels 0,7 --dtype bf16 \
  --image-info scripts/gpu/image-h200x2.json --out-dir "$OUT/l7"
echo "rc=$?"
date -u
