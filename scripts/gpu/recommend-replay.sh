#!/usr/bin/env bash
# Device call "recommend" of issue 20's kit (scripts/gpu/PLAN-issue20.md), ON THE GPU HOST
# from the repository root, after every part is staged: the replay venv (built here if
# this machine has none yet: scripts/gpu/replay-setup.sh), then scripts/gpu/recommend.sh
# with the lock's own FlashAttention 4 and the replay's image info for the enhanced variant
# (scripts/gpu/replay-info/image-enhanced.json: what stackpin renders into the image,
# "run_kind": "lock replayed on device", its differences named, the cell's workload
# shapes the timing is judged on). L3 and L5 in bf16, about 5 min with FA4's compiles.
# Writes $OUT/setup.log and $OUT/recommend/{run.log, report.json, report.xml}.
# Usage: bash scripts/gpu/recommend-replay.sh   (OUT is set by the device tool)
set -uo pipefail
OUT=${OUT:?OUT must name the folder whose files come back}
bash scripts/gpu/replay-setup.sh >"$OUT/setup.log" 2>&1
rc=$?
cat "$OUT/setup.log"
[ "$rc" = 0 ] || exit "$rc"
mkdir -p /tmp/replay/no-site  # recommend.sh adds SITE to the path: the venv holds everything
export VIRTUAL_ENV=/tmp/replay/venv PATH=/tmp/replay/venv/bin:$PATH
PYTHON=/tmp/replay/venv/bin/python SITE=/tmp/replay/no-site \
    IMAGE_INFO=${IMAGE_INFO:-scripts/gpu/replay-info/image-enhanced.json} \
    bash scripts/gpu/recommend.sh
