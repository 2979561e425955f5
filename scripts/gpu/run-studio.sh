#!/usr/bin/env bash
# Start Unsloth Studio's backend natively (no container) and drive its Train chain over HTTP
# with scripts/gpu/studio-chain.py (beside this script), on the tiny chat model and dataset
# that `python -m stackpin_verify.tinychat` (ROOT/verify) writes:
#
#   scripts/gpu/run-studio.sh OUT_DIR [STEPS]
#
# Environment: PY (default python3) is the interpreter that holds torch/transformers and
# unsloth (its wheel ships studio/); PYTHONPATH may prepend carried wheels (see
# install-wheels.sh). Offline throughout: HF_HUB_OFFLINE, Studio's diffusers self-repair off.
# Writes OUT_DIR/answers.json (every HTTP answer), server.log, chain.log and, where
# nvidia-smi exists, nvidia-smi.csv (GPU memory/utilisation sampled every 500 ms).
# Exit: the chain's status (0 completed, 6 a step failed), 5 if the server died first, 124
# when CHAIN_TIMEOUT ran out.
# CHAIN_TIMEOUT (seconds, default none) ends the chain itself, so the logs are still
# gathered inside a device call's limit; HEALTH_TIMEOUT and TRAIN_TIMEOUT go to the chain.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
source "$HERE/env.sh"
OUT=${1:?usage: run-studio.sh OUT_DIR [STEPS]}
STEPS=${2:-30}
PY=${PY:-python3}
PORT=${PORT:-8899}
WORK=$(mktemp -d /tmp/studio-proof.XXXXXX)
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT/verify"
export UNSLOTH_STUDIO_HOME="$WORK/state" HOME="$WORK/home"
export HF_HOME="$WORK/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export UNSLOTH_DISABLE_DIFFUSERS_AUTOREPAIR=1 UNSLOTH_DIFFUSERS_MAIN=0
export HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1
mkdir -p "$HOME"

"$PY" -m stackpin_verify.tinychat model "$WORK/tinychat" || exit 5
"$PY" -m stackpin_verify.tinychat dataset "$WORK/tinychat-train.jsonl" --rows 64 || exit 5
STUDIO=$("$PY" -c 'import os, studio; print(os.path.dirname(studio.__file__))') || exit 5
"$PY" - <<'EOF' | tee "$OUT/versions.txt"
import importlib.metadata as md, platform, torch
print("python", platform.python_version())
for dist in ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "unsloth",
             "unsloth_zoo", "tokenizers", "fastapi", "uvicorn", "pydantic", "numpy", "triton"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        print(dist, "absent")
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
EOF

SAMPLER=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total,utilization.gpu \
    --format=csv -lms 500 >"$OUT/nvidia-smi.csv" 2>&1 &
  SAMPLER=$!
fi

(cd "$STUDIO/backend" && exec "$PY" run.py --host 127.0.0.1 --port "$PORT") \
  >"$OUT/server.log" 2>&1 &
SERVER=$!
echo "server pid $SERVER, state $UNSLOTH_STUDIO_HOME, studio $STUDIO"

limit=()
[ -n "${CHAIN_TIMEOUT:-}" ] && limit=(timeout "$CHAIN_TIMEOUT")
${limit[@]+"${limit[@]}"} "$PY" "$HERE/studio-chain.py" --base "http://127.0.0.1:$PORT" \
  --state "$UNSLOTH_STUDIO_HOME" --model "$WORK/tinychat" \
  --dataset "$WORK/tinychat-train.jsonl" --out "$OUT" --steps "$STEPS" --server-pid "$SERVER" \
  --health-timeout "${HEALTH_TIMEOUT:-180}" --train-timeout "${TRAIN_TIMEOUT:-400}" 2>&1 | tee "$OUT/chain.log"
RC=${PIPESTATUS[0]}
kill -0 "$SERVER" 2>/dev/null || { echo "server exited early"; [ "$RC" = 0 ] || RC=5; }

kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null
[ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
# What the training subprocess and the run folder left: the logs and the file list.
find "$UNSLOTH_STUDIO_HOME" -path '*/logs/*' -type f -exec sh -c \
  'for f; do echo "== $f"; tail -n 400 "$f"; done' _ {} + >"$OUT/studio-logs.txt" 2>&1
echo "chain exit $RC"
exit "$RC"
