#!/usr/bin/env bash
# Run ON ONE H200 from the repository root (issue 22 item 7): mutation testing of verify/
# with the GPU VISIBLE (no CUDA_VISIBLE_DEVICES), the scored functions of every scored
# module (scripts/mutation_score.py SCORED), 16 workers; then, with the time left, the
# tolerance constants (scripts/mutate_constants.py).
#
#   OUT=... bash scripts/gpu/mutation-h200.sh WHEELS [SECONDS]
#
# WHEELS: the folder of mutmut 3.8.1 and what it needs beyond the host's packages
# (scripts/gpu/stage-issue22.sh puts them in .whl/mut). SECONDS (default 540): the whole
# call's budget; mutmut is interrupted before it (the results so far are kept) and a second
# call with the same MUTATION_DIR (default /tmp/mut, kept while the machine is held) runs only
# the scored mutants still without a result.
# Before mutmut, the selected tests run once with the GPU visible (pytest -n 16): a test that
# fails there before any mutation is deselected, and named in precheck.txt (mutmut refuses a
# red suite).
# Writes into $OUT (at most 6 files): run.log, precheck.txt, score.txt (the score per
# module and every scored mutant not killed), mutmut-raw.json (mutmut's exit code for every
# mutant, merged), constants.json and constants.log (when reached).
set -uo pipefail
# shellcheck source=scripts/gpu/env.sh
. scripts/gpu/env.sh
WHEELS=${1:?usage: mutation-h200.sh WHEELS [SECONDS]}
BUDGET=${2:-540}
OUT=${OUT:-/tmp/stackpin-mutation}
export MUTATION_DIR=${MUTATION_DIR:-/tmp/mut}
SITE=/tmp/mutsite
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
end=$((SECONDS + BUDGET))

echo "== host"
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHEELS"/*.whl || exit 8
export PYTHONPATH=$SITE OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
python3 -m mutmut --version || exit 8
python3 -c 'import torch; print("torch", torch.__version__, "cuda visible:", torch.cuda.is_available(), torch.cuda.device_count())'

if [ ! -s "$MUTATION_DIR/deselect.txt" ] && [ ! -e "$MUTATION_DIR/precheck.done" ]; then
  echo "== pre-check: the verify tests with the GPU visible"
  mkdir -p "$MUTATION_DIR"
  tests=()
  for path in tests/unit/test_verify_*.py; do
    [[ $path == *test_verify_tinychat.py ]] || tests+=("$path")
  done
  # The tests no mutation run selects (scripts/mutation_score.py LEFT_OUT, their one home).
  mapfile -t left_out < <(python3 scripts/mutation_score.py --left-out | sed 's/^/--deselect=/')
  PYTHONPATH=$SITE:src:verify timeout 240 python3 -m pytest -n 16 -q -p no:cacheprovider \
    -m "not docker" -rfE "${tests[@]}" \
    "${left_out[@]}" > "$OUT/precheck.txt" 2>&1
  echo "pre-check exit $?"; tail -n 30 "$OUT/precheck.txt"
  passed=$(grep -oE "[0-9]+ passed" "$OUT/precheck.txt" | tail -n 1 | cut -d' ' -f1)
  if [ "${passed:-0}" -lt 300 ]; then  # 431 pass on a CPU host: a broken set-up, not a red test
    echo "only ${passed:-0} verify tests passed here: fix the set-up (precheck.txt), not a deselect"
    exit 8
  fi
  grep -E "^(FAILED|ERROR) " "$OUT/precheck.txt" | awk '{print $2}' | sed 's/ .*//' \
    | sort -u > "$MUTATION_DIR/deselect.txt"
  touch "$MUTATION_DIR/precheck.done"
fi
args=""
while read -r id; do [ -n "$id" ] && args+=" --deselect $id"; done < "$MUTATION_DIR/deselect.txt"
echo "deselected (red with the GPU visible before any mutation): ${args:-none}"

echo "== mutmut, GPU visible, 16 workers"
left=$((end - SECONDS - 45))  # keep time for the score and the files
MUTATION_JOBS=16 PYTHON=python3 MUTATION_PYTEST_ARGS="$args" \
  timeout -s INT -k 30 "$left" bash scripts/mutation-test.sh > "$OUT/mutmut.log" 2>&1
echo "mutmut exit $? ($((SECONDS)) s into the call)"
tail -c 400 "$OUT/mutmut.log" | tr '\r' '\n' | tail -n 3
python3 scripts/mutation_score.py "$MUTATION_DIR/mutants" --json "$OUT/mutmut-raw.json" \
  > "$OUT/score.txt"
head -n 40 "$OUT/score.txt"
rm -f "$OUT/mutmut.log"  # spinner frames; the score and the raw results say it all

left=$((end - SECONDS - 20))
if [ "$left" -gt 120 ] && [ "${CONSTANTS:-1}" = 1 ]; then
  echo "== tolerance constants, $left s left"
  extra=()
  while read -r id; do [ -n "$id" ] && extra+=("--pytest-arg=--deselect=$id"); done \
    < "$MUTATION_DIR/deselect.txt"
  PYTHONPATH=$SITE:src:verify timeout "$left" python3 scripts/mutate_constants.py --jobs 16 \
    --out "$OUT/constants.json" "${extra[@]}" > "$OUT/constants.log" 2>&1
  echo "constants exit $?"; tail -n 40 "$OUT/constants.log"
fi
ls -la "$OUT"
date -u
