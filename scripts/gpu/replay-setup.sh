#!/usr/bin/env bash
# ON THE GPU HOST, from the repository root, once every part is in /tmp/lockparts
# (scripts/gpu/stage-part.sh): join the parts, check every carried file's sha256 against
# replay.json, and build the replay venv at /tmp/replay/venv with the whole lock (the
# vendor, stack and attention layers: the enhanced variant, which holds the stable one):
# the host's torch 2.11.0+cu130 and CUDA libraries seen through a .pth after the venv's
# own, every other distribution installed --no-deps at the lock's version. Idempotent: a
# venv built from the same replay.json is kept (a second call costs a second).
# Usage: bash scripts/gpu/replay-setup.sh   (prints; exits 8 when it cannot; LOCKPARTS and
# REPLAY_DIR move /tmp/lockparts and /tmp/replay)
set -uo pipefail
parts=${LOCKPARTS:-/tmp/lockparts}
WORK=${REPLAY_DIR:-/tmp/replay}
VENV=$WORK/venv
mkdir -p "$WORK"
[ -f "$parts"/parts.sha256 ] || { echo "replay-setup: no parts staged (stage-part.sh first)"; exit 8; }
( cd "$parts" && sha256sum --check --quiet parts.sha256 ) \
    || { echo "replay-setup: a part is missing or differs: stage the parts again"; exit 8; }
stamp=$(sha256sum "$parts"/parts.sha256 | cut -c1-64)
if [ -f "$VENV/.stackpin-replay" ] && [ "$(cat "$VENV/.stackpin-replay")" = "$stamp" ]; then
    echo "replay-setup: $VENV is already built from these parts"
    exit 0
fi
start=$SECONDS
rm -rf "$WORK/wheels" "$VENV"
cat "$parts"/part-* | tar -x -C "$WORK" || { echo "replay-setup: the parts do not join"; exit 8; }
python3 - "$WORK/wheels" <<'PY' || exit 8
import hashlib, json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
replay = json.loads((folder / "replay.json").read_text())
bad = [e["replay_file"] for e in replay["entries"] if e["replay_file"] and hashlib.sha256(
    (folder / e["replay_file"]).read_bytes()).hexdigest() != e["replay_sha256"]]
carried = sum(1 for e in replay["entries"] if e["replay_file"])
print(f"replay-setup: carried files: {carried}, sha256 mismatches: {len(bad)} {bad}")
sys.exit(1 if bad else 0)
PY
python3 -m venv "$VENV"
PY="$VENV/bin/python"
# The host's python3 is itself a venv: --system-site-packages would see the base
# interpreter's folder, not the one holding torch. A .pth puts the host's site-packages
# after the replay's own, so every distribution installed here shadows the host's.
host_site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
"$PY" -c 'import site, sys; open(site.getsitepackages()[0] + "/zz-host.pth", "w").write(sys.argv[1] + "\n")' "$host_site"
mapfile -t files < <(python3 - "$WORK/wheels" <<'PY'
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
for e in json.loads((folder / "replay.json").read_text())["entries"]:
    if e["replay_file"]:
        print(folder / e["replay_file"])
PY
)
"$PY" -m pip install -q --no-index --no-deps --no-compile "${files[@]}" \
    || { echo "replay-setup: pip could not install the carried files"; exit 8; }
echo "$stamp" >"$VENV/.stackpin-replay"
echo "replay-setup: $VENV holds the lock's ${#files[@]} carried files beside the host's own builds ($((SECONDS - start)) s)"
