#!/usr/bin/env bash
# Run ON ONE H200 from the repository root, after `scripts/gpu/install-wheels.sh .whl/h13fa`
# (the FlashAttention wheel into $SITE), as one command (issue 22 item 8):
#
#   OUT=... scripts/gpu/run-h200-issue22.sh
#
# First the honest suite, L0-L6 (expect every issue-22 check to pass), then the suite with
# each issue-22 fault of tests/faults/sitecustomize.py injected at start-up, on the levels
# it touches. The GPU-only paths (FlashAttention's uneven varlen and range cases, the GEMM
# bound on an accelerator) are judged only here. Writes into $OUT:
#   run.log, honest/report.json, <fault>/report.json, and summary.json: for each run its
#   exit code, the checks that failed, and whether every check the fault must fail did.
# FAULTS="a b" runs only those faults.
set -uo pipefail
. scripts/gpu/env.sh
OUT=${OUT:-/tmp/stackpin-evidence}
SITE=${SITE:-/tmp/site}
IMAGE=scripts/gpu/image-h200-fa.json
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1

# fault -> "levels|check-name prefixes that must fail" (a prefix ends with '.')
declare -A EXPECT=(
  [sdpa_mask_ignored]="3,5,6|L3.sdpa.bf16.padded.left. L5.lora.batched_generation L6.batched.bf16"
  [sdpa_mask_right_aligned]="3|L3.sdpa.bf16.padded.left."
  [sdpa_narrow_bf16]="3|L3.sdpa.bf16.range.values"
  [flash_narrow_bf16]="3|L3.flash.bf16.range.values"
  [flash_cu_seqlens_k_ignored]="3|L3.flash.bf16.varlen_qk. L3.flash.fp16.varlen_qk."
  [flash_causal_top_left]="3|L3.flash.bf16.varlen_qk.dense.causal L3.flash.bf16.varlen_qk.gqa.causal"
  [matmul_fp16_accumulate]="1|L1.gemm.fp16.large_k L1.gemm.bf16.large_k"
  [lora_A_frozen]="5|L5.lora.tensors_learned"
  [adamw_skips_half]="5|L5.lora.optimizer_steps"
  [adapter_saved_stale]="5|L5.lora.adapter_roundtrip"
  [lora_layer1_frozen]="5|L5.lora.adapter_layers"
)
read -ra FAULT_LIST <<< "${FAULTS:-${!EXPECT[*]}}"

echo "== host"
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 --version

run() {  # name levels [fault]
  echo "== $1 (levels $2)"
  env ${3:+STACKPIN_FAULT=$3} PYTHONPATH=tests/faults:"$SITE":verify timeout 300 \
    python3 -m stackpin_verify --levels "$2" --image-info "$IMAGE" --out-dir "$OUT/$1" \
    > "$OUT/$1.stdout" 2>&1
  echo "rc=$?" | tee "$OUT/$1/rc"
}

run honest 0,1,2,3,4,5,6
for fault in "${FAULT_LIST[@]}"; do
  run "$fault" "${EXPECT[$fault]%%|*}" "$fault"
done

python3 - "$OUT" "${FAULT_LIST[@]}" <<'PY'
import json, sys
from pathlib import Path

out, faults = Path(sys.argv[1]), sys.argv[2:]
expect = {}
for line in Path("scripts/gpu/run-h200-issue22.sh").read_text().splitlines():
    line = line.strip()
    if line.startswith("[") and "]=" in line:
        name, _, rest = line[1:].partition("]=")
        expect[name] = rest.strip('"').split("|")[1].split()

def load(name):
    report = json.loads((out / name / "report.json").read_text())
    rc = int((out / name / "rc").read_text().strip().removeprefix("rc="))
    failed = sorted(c["name"] for c in report["checks"] if c["status"] == "fail")
    return rc, failed, report["checks"]

summary = {}
rc, failed, checks = load("honest")
new = ("padded", "range", "varlen_qk", "large_k", "edges", "batched", "tensors_learned",
       "optimizer_steps", "adapter_layers")
summary["honest"] = {
    "rc": rc, "failed": failed,
    "issue22_checks": {c["name"]: c["status"] for c in checks if any(n in c["name"] for n in new)},
}
for fault in faults:
    rc, failed, _ = load(fault)
    must = expect[fault]
    caught = {m: any(f == m or (m.endswith(".") and f.startswith(m)) for f in failed) for m in must}
    summary[fault] = {"rc": rc, "failed": failed, "must_fail": caught, "caught": all(caught.values())}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps({k: v.get("caught", v["rc"]) for k, v in summary.items()}, indent=1))
PY
date -u
