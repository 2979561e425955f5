#!/usr/bin/env bash
# Run ON THE GPU HOST from the repository root, once every .whl/lock/part-* has been copied
# to /tmp/lockparts by the calls before (one part a call: each fits the device tool's 64 MiB
# beside the working tree). Replays the cell's lock on the device:
#   1. joins the parts and checks every carried file's sha256 against replay.json;
#   2. a venv that sees the host's torch 2.11.0+cu130 and its CUDA libraries (the same
#      versions the lock pins; a .pth after the venv's own), every other distribution of the lock
#      installed --no-deps at the lock's version (the lock's own file, or its cp312 build);
#   3. L0-L6 of the stable variant, then the attention layer added and L0-L6 of enhanced,
#      each with the image info stackpin renders for that variant (docs/evidence/...);
#   4. Studio's Train chain (login, upload, LoRA run, checkpoint, chat with the adapter).
# Usage: scripts/gpu/replay-lock.sh EVIDENCE_DIR OUT_DIR [STEPS]   (STUDIO=0: levels only; STABLE=0: enhanced only)
set -uo pipefail
# shellcheck source=scripts/gpu/env.sh
. scripts/gpu/env.sh
EVIDENCE=${1:?usage: replay-lock.sh EVIDENCE_DIR OUT_DIR [STEPS]}
OUT=${2:?usage: replay-lock.sh EVIDENCE_DIR OUT_DIR [STEPS]}
STEPS=${3:-30}
WORK=/tmp/replay
mkdir -p "$OUT" "$WORK"
date -u
rm -rf "$WORK/wheels"
cat /tmp/lockparts/part-* | tar -x -C "$WORK" || { echo "parts incomplete"; exit 8; }
python3 - "$WORK/wheels" <<'PY' || exit 8
import hashlib, json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
replay = json.loads((folder / "replay.json").read_text())
bad = [e["replay_file"] for e in replay["entries"] if e["replay_file"] and hashlib.sha256(
    (folder / e["replay_file"]).read_bytes()).hexdigest() != e["replay_sha256"]]
carried = sum(1 for e in replay["entries"] if e["replay_file"])
print(f"carried files: {carried}, sha256 mismatches: {len(bad)} {bad}")
sys.exit(1 if bad else 0)
PY
files() {  # files GROUP...: the carried files of those lock groups
    python3 - "$WORK/wheels" "$@" <<'PY'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
for e in json.loads((folder / "replay.json").read_text())["entries"]:
    if e["replay_file"] and e["group"] in sys.argv[2:]:
        print(folder / e["replay_file"])
PY
}
rm -rf "$WORK/venv" && python3 -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
# The host's python3 is itself a venv: --system-site-packages would see the base
# interpreter's folder, not the one holding torch. A .pth puts the host's site-packages
# after the replay's own, so every distribution installed here shadows the host's.
host_site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
"$PY" -c 'import site, sys; open(site.getsitepackages()[0] + "/zz-host.pth", "w").write(sys.argv[1] + "\n")' "$host_site"
# Active, as in the image (its PATH starts with the venv): the suite's child interpreters
# are the plain `python` on PATH.
export VIRTUAL_ENV="$WORK/venv" PATH="$WORK/venv/bin:$PATH"
mapfile -t below < <(files vendor stack)
"$PY" -m pip install -q --no-index --no-deps --no-compile "${below[@]}" || exit 8
echo "installed the vendor and stack layers: ${#below[@]} files"
"$PY" -m pip freeze >"$OUT/freeze-stable.txt"
run_levels() {  # run_levels VARIANT
    echo "== L0-L6 $1 (lock replayed on device)"
    env PYTHONPATH=verify timeout 400 "$PY" -m stackpin_verify --levels 0,1,2,3,4,5,6 \
        --dtype bf16 --image-info "$EVIDENCE/image-$1.json" --out-dir "$OUT/$1"
    echo "rc=$?"
}
[ "${STABLE:-1}" = 1 ] && run_levels stable
mapfile -t attention < <(files attention)
"$PY" -m pip install -q --no-index --no-deps --no-compile "${attention[@]}" || exit 8
echo "installed the attention layer: ${#attention[@]} files"
"$PY" -m pip freeze >"$OUT/freeze-enhanced.txt"
run_levels enhanced
if [ "${STUDIO:-1}" = 1 ]; then
    echo "== Studio Train chain ($STEPS steps) on the enhanced environment"
    PY="$PY" bash scripts/gpu/run-studio.sh "$OUT/studio" "$STEPS"
    echo "studio rc=$?"
fi
date -u
