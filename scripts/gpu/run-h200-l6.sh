#!/usr/bin/env bash
# Run ON ONE H200 from the repository root (issue 13 item 4: L6 against float64 golden
# answers; item 6: the L0-L6 headline from committed code). Two parts, one per call:
#
#   scripts/gpu/run-h200-l6.sh l6        L6 alone in fp32, fp16 and bf16, then L6 with each
#                                        kernel fault of tests/faults/sitecustomize.py
#                                        (expect exit 1 and every golden case failing)
#   scripts/gpu/run-h200-l6.sh headline  L0-L6, FlashAttention wheel installed in $SITE
#                                        (install-wheels.sh), image-h200-fa.json
#
# Writes into $OUT: run-<part>.log, and l6/report.{json,xml} + faults/<fault>.json (each
# fault run's report.json), or headline/report.{json,xml}.
set -uo pipefail
. scripts/gpu/env.sh
OUT=${OUT:-/tmp/stackpin-evidence}
SITE=${SITE:-/tmp/site}
IMAGE=scripts/gpu/image-h200-fa.json
FAULTS=(sdpa_noise linear_noise sdpa_causal_ignored rope_reversed logits_scaled)
mkdir -p "$OUT"
cmd() { echo "+ $*"; "$@"; echo "rc=$?"; }

host() {
  echo "== host"
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 --version
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'tf32', torch.backends.cuda.matmul.allow_tf32)"
}

l6_summary() {  # report.json: one line per L6 check
  python3 - "$1" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["checks"]:
    m = c["metrics"]
    keys = ("exact", "cases", "error_ratio", "factor", "min_margin_ratio", "steps")
    shown = " ".join(f"{k}={m[k]:.4g}" if isinstance(m[k], float) else f"{k}={m[k]}"
                     for k in keys if k in m)
    print(f"  {c['name']:<18} {c['status']:<5} {shown}  {c['reason'][:160]}")
PY
}

part_l6() {
  echo "== L6 alone: fp32, fp16, bf16; full recompute and KV-cache decoding"
  cmd env PYTHONPATH=verify timeout 200 python3 -m stackpin_verify --levels 6 \
    --image-info "$IMAGE" --out-dir "$OUT/l6"
  l6_summary "$OUT/l6/report.json"
  for fault in "${FAULTS[@]}"; do
    echo "== L6 with fault $fault: expect exit 1, every golden case failing"
    cmd env STACKPIN_FAULT="$fault" PYTHONPATH=tests/faults:verify timeout 200 \
      python3 -m stackpin_verify --levels 6 --image-info "$IMAGE" --out-dir "/tmp/l6-$fault"
    l6_summary "/tmp/l6-$fault/report.json"
    mkdir -p "$OUT/faults" && cp "/tmp/l6-$fault/report.json" "$OUT/faults/$fault.json"
  done
}

part_headline() {
  echo "== headline: L0-L6, committed code"
  cmd env PYTHONPATH="$SITE":verify timeout 400 python3 -m stackpin_verify \
    --levels 0,1,2,3,4,5,6 --image-info "$IMAGE" --out-dir "$OUT/headline"
  python3 - "$OUT/headline/report.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print("  summary", report["summary"])
for c in report["checks"]:
    if c["status"] == "fail" or c["name"].startswith("L6."):
        print(f"  {c['name']} {c['status']} {c['reason'][:200]}")
PY
}

{
  host
  case "${1:-}" in
    l6) part_l6 ;;
    headline) part_headline ;;
    *) echo "usage: $0 l6|headline" >&2; exit 2 ;;
  esac
  date -u
} 2>&1 | tee "$OUT/run-${1:-usage}.log"
