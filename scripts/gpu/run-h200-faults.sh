#!/usr/bin/env bash
# Run ON ONE H200 from the repository root, after `install-wheels.sh .whl/h13fa` (the FlashAttention wheel alone) (issue 13).
# Writes into $OUT:
#   headline/report.{json,xml}  L0-L6, fp16+bf16 attention, committed code, image-h200-fa.json
#   <fault>/report.{json,xml}   the suite with one kernel fault injected at start-up by
#                               tests/faults/sitecustomize.py (STACKPIN_FAULT=<fault>)
set -uo pipefail
. scripts/gpu/env.sh
OUT=${OUT:-/tmp/stackpin-evidence}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
cmd() { echo "+ $*"; "$@"; echo "rc=$?"; }

echo "== host"
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 --version

echo "== headline: L0-L6, committed code"
cmd env PYTHONPATH="$SITE":verify timeout 300 python3 -m stackpin_verify --levels 0,1,2,3,4,5,6 \
  --image-info scripts/gpu/image-h200-fa.json --out-dir "$OUT/headline"

run_fault() {  # fault levels
  echo "== fault $1 (levels $2): expect exit 1"
  cmd env STACKPIN_FAULT="$1" PYTHONPATH=tests/faults:"$SITE":verify timeout 200 \
    python3 -m stackpin_verify --levels "$2" --image-info scripts/gpu/image-h200-fa.json \
    --out-dir "$OUT/$1"
  python3 - "$OUT/$1/report.json" <<'PY'
import collections, json, sys
report = json.load(open(sys.argv[1]))
by = collections.Counter((c["name"].split(".")[1], c["status"]) for c in report["checks"])
print("  ", dict(sorted(by.items())), "required_failed", report["summary"]["required_failed"])
PY
}
run_fault matmul_no_kernel_image 1
run_fault sdpa_noise 3
run_fault flash_noise 3
run_fault sdpa_causal_ignored 3
run_fault flash_causal_ignored 3
date -u
