#!/usr/bin/env bash
# Run ON ONE H200 from the repository root, once FlashAttention 2 is in $SITE (see
# scripts/gpu/PLAN-issue22.md: the wheel travels in two halves), as one command (issue 22
# item 8):
#
#   OUT=... bash scripts/gpu/run-h200-issue22.sh
#
# 1. The honest suite, L0-L6, alone on the machine: every issue-22 check must pass, and its
#    per-level seconds are the H200 time-budget figure for this stack (host torch + FA2).
# 2. Each issue-22 fault of tests/faults/sitecustomize.py injected at start-up, on the
#    levels it touches: L1's alone (its GEMM timing is judged against do_bench), the others
#    FAULT_JOBS at a time (their timed checks are optional and not judged here).
#    A fault is "caught" when every check it must fail fails, for a reason that is not the
#    fault harness's own error, and every check it must leave alone passes.
# The GPU-only paths (FlashAttention's uneven varlen and range cases with the real kernel,
# the GEMM bound on an accelerator) are judged only here.
# Writes into $OUT, 5 files: run.log, summary.json, honest-report.json, honest-stdout.txt,
# reports.tar.gz (every run's report.json, stdout and exit code).
# FAULTS="a b" runs only those faults; FAULT_JOBS (default 5).
set -uo pipefail
# shellcheck source=scripts/gpu/env.sh
. scripts/gpu/env.sh
OUT=${OUT:-/tmp/stackpin-evidence}
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/issue22}
JOBS=${FAULT_JOBS:-5}
IMAGE=scripts/gpu/image-h200-fa.json
rm -rf "$WORK" && mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/run.log") 2>&1

# fault -> "levels|checks that must fail|checks that must pass" (a name ending in '.' is a
# prefix: every check under it)
declare -A EXPECT=(
  [matmul_fp16_accumulate]="1|L1.gemm.fp16.large_k L1.gemm.bf16.large_k|L1.gemm.fp32 L1.gemm.fp32.large_k"
  [sdpa_mask_ignored]="3,5,6|L3.sdpa.bf16.padded.left. L3.sdpa.bf16.padded.right. L5.lora.batched_generation L6.batched.bf16|L3.sdpa.bf16.dense."
  [sdpa_mask_right_aligned]="3|L3.sdpa.bf16.padded.left.|L3.sdpa.bf16.padded.right. L3.sdpa.bf16.dense."
  [sdpa_narrow_bf16]="3|L3.sdpa.bf16.range.values|L3.sdpa.bf16.dense. L3.sdpa.fp16.range.values"
  [flash_narrow_bf16]="3|L3.flash.bf16.range.values|L3.flash.bf16.dense. L3.flash.fp16.range.values"
  [flash_cu_seqlens_k_ignored]="3|L3.flash.bf16.varlen_qk. L3.flash.fp16.varlen_qk.|L3.flash.bf16.varlen. L3.flash.bf16.dense."
  [flash_causal_top_left]="3|L3.flash.bf16.varlen_qk.dense.causal L3.flash.bf16.varlen_qk.gqa.causal|L3.flash.bf16.varlen_qk.dense.noncausal L3.flash.bf16.varlen_qk.gqa.noncausal L3.flash.bf16.varlen."
  [lora_A_frozen]="5|L5.lora.tensors_learned|L5.lora.attach L5.lora.train"
  [adamw_skips_half]="5|L5.lora.optimizer_steps|L5.lora.attach"
  [adapter_saved_stale]="5|L5.lora.adapter_roundtrip|L5.lora.train L5.lora.tensors_learned"
  [lora_layer1_frozen]="5|L5.lora.adapter_layers|L5.lora.attach"
)
read -ra FAULT_LIST <<< "${FAULTS:-${!EXPECT[*]}}"

echo "== host"
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 --version
PYTHONPATH="$SITE" python3 -c 'import flash_attn, torch; print("flash_attn", flash_attn.__version__, "torch", torch.__version__)' \
  || { echo "flash_attn does not import from $SITE: install it first"; exit 8; }

run() {  # name levels [fault]
  mkdir -p "$WORK/$1"
  local start=$SECONDS
  env ${3:+STACKPIN_FAULT=$3} PYTHONPATH=${3:+tests/faults:}"$SITE":verify timeout 300 \
    python3 -m stackpin_verify --levels "$2" --image-info "$IMAGE" --out-dir "$WORK/$1" \
    > "$WORK/$1/stdout.txt" 2>&1
  local rc=$?
  echo "$rc" > "$WORK/$1/rc"
  echo "== $1 (levels $2): rc=$rc in $((SECONDS - start)) s"
}

run honest 0,1,2,3,4,5,6
grep -E "^per level|passed|failed" "$WORK/honest/stdout.txt" | tail -3
# L1's fault alone: the GEMM checks time themselves against do_bench.
for fault in "${FAULT_LIST[@]}"; do
  [ "${EXPECT[$fault]%%|*}" = 1 ] && run "$fault" 1 "$fault"
done
pids=()
for fault in "${FAULT_LIST[@]}"; do
  [ "${EXPECT[$fault]%%|*}" = 1 ] && continue
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  run "$fault" "${EXPECT[$fault]%%|*}" "$fault" &
  pids+=($!)
done
# Only the fault runs: a bare `wait` (bash >= 5.1) also waits for the `tee` behind
# `exec > >(...)`, which ends only when this script does: on the H200 it hung to the limit.
for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid"; done

EXPECTATIONS=$(for f in "${FAULT_LIST[@]}"; do echo "$f|${EXPECT[$f]}"; done)
export EXPECTATIONS
python3 scripts/gpu/fault-summary.py "$WORK" "$OUT"
cp "$WORK/honest/report.json" "$OUT/honest-report.json"
cp "$WORK/honest/stdout.txt" "$OUT/honest-stdout.txt"
tar -czf "$OUT/reports.tar.gz" -C "$WORK" .
ls -la "$OUT"
date -u
