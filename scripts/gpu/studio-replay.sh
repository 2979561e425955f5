#!/usr/bin/env bash
# Device call "studio" of issue 20's kit (scripts/gpu/PLAN-issue20.md), ON THE GPU HOST from
# the repository root, after every part is staged: build the replay venv if this machine
# has none yet (scripts/gpu/replay-setup.sh, about 1-2 min), then Studio's Train chain on
# the replayed lock: health, login, forced password change, dataset upload, a 2-step LoRA
# run to checkpoint-1 and -2, the run in history, the adapter loaded and one chat with it.
# Unsloth's import and compile took about 2 min last time: the chain gets CHAIN_TIMEOUT
# (default 480 s) in all, so the logs are gathered before the call's 600 s limit.
# Writes, as it happens: $OUT/setup.log, $OUT/studio/{versions.txt, server.log, chain.log,
# answers.json (after every step), nvidia-smi.csv}, then studio-logs.txt (7 files).
# Usage: bash scripts/gpu/studio-replay.sh [STEPS]   (OUT is set by the device tool)
set -uo pipefail
OUT=${OUT:?OUT must name the folder whose files come back}
STEPS=${1:-2}
bash scripts/gpu/replay-setup.sh >"$OUT/setup.log" 2>&1
rc=$?
cat "$OUT/setup.log"
[ "$rc" = 0 ] || exit "$rc"
export VIRTUAL_ENV=/tmp/replay/venv PATH=/tmp/replay/venv/bin:$PATH
export PY=/tmp/replay/venv/bin/python
export CHAIN_TIMEOUT=${CHAIN_TIMEOUT:-480} HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-180}
export TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-360}
bash scripts/gpu/run-studio.sh "$OUT/studio" "$STEPS"
