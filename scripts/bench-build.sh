#!/usr/bin/env bash
# Build benchmark (issue 3), measured side by side in one run on one machine:
#   1. cold build of the CPU default with stackpin (--no-cache), with and without normalisation
#   2. cold build of a hand-written minimal Dockerfile doing the same installs
#   3. warm rebuild with nothing changed
#   4. rebuild after changing one stack pin (trl), counting reused steps
# Prints a Markdown table; ratios matter, absolute seconds depend on the machine's load.
# Needs: scripts/setup-host.sh done, the CPU default's wheelhouse fetched and base loaded.
set -euo pipefail
cd "$(dirname "$0")/.."
sp="$PWD/.venv/bin/stackpin"
cell=cpu-bookworm-torch2130-py311
work=$(mktemp -d /tmp/stackpin-bench.XXXXXX)
trap 'rm -rf "$work"; docker rmi -f stackpin-bench/handwritten:1 >/dev/null 2>&1 || true' EXIT

now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }

$sp build "$cell" >/dev/null  # make sure the base and the wheelhouse are in place
base=$(python3 -c "import json;print(json.load(open('pinning/locks/$cell.lock'))['base']['reference'])")

# --- hand-written equivalent: same base, same wheels, same hashes, one stage ----------
mkdir -p "$work/hand/wheels"
ln build/context/$cell-stable/wheels/*/*.whl "$work/hand/wheels/" 2>/dev/null \
    || cp build/context/$cell-stable/wheels/*/*.whl "$work/hand/wheels/"
cat build/context/$cell-stable/wheels/*/requirements.txt | grep -v '^#' > "$work/hand/requirements.txt"
cat > "$work/hand/Dockerfile" <<EOF
FROM $base
COPY wheels/ /wheels/
COPY requirements.txt /wheels/
RUN python3 -m venv /venv && /venv/bin/pip install --no-index --no-deps --find-links /wheels -r /wheels/requirements.txt && rm -rf /wheels
EOF

t0=$(now); docker build -q --no-cache --network none -t stackpin-bench/handwritten:1 "$work/hand" >/dev/null; t1=$(now)
hand=$(secs "$t0" "$t1")

t0=$(now); $sp build "$cell" --no-cache --no-normalize --json > "$work/cold-nn.json"; t1=$(now)
cold_nn=$(secs "$t0" "$t1")
t0=$(now); $sp build "$cell" --no-cache --json > "$work/cold.json"; t1=$(now)
cold=$(secs "$t0" "$t1")
# Warm right after the normalised build: the raw image is unchanged, so normalisation is
# reused (measuring it after a --no-normalize build would time a normalisation instead).
t0=$(now); $sp build "$cell" --json > "$work/warm.json"; t1=$(now)
warm=$(secs "$t0" "$t1")

# --- one pin changed (trl 1.16.0 -> 1.15.0) in a copy of the project ------------------
mkdir -p "$work/proj"
cp -r pinning templates verify "$work/proj/"
mkdir -p "$work/proj/wheels" && cp -al "wheels/$cell" "$work/proj/wheels/$cell"
sed -i 's/^trl = "1.16.0"/trl = "1.15.0"/' "$work/proj/pinning/cpu.toml"
(cd "$work/proj" && $sp wheels fetch "$cell" >/dev/null)
t0=$(now); (cd "$work/proj" && $sp build "$cell" --json > "$work/pin.json"); t1=$(now)
pin=$(secs "$t0" "$t1")
pin_cached=$(python3 -c "import json;r=json.load(open('$work/pin.json'))[0];print(f\"{r['cached_steps']}/{r['steps']}\")")
warm_cached=$(python3 -c "import json;r=json.load(open('$work/warm.json'))[0];print(f\"{r['cached_steps']}/{r['steps']}\")")
norm=$(python3 -c "import json;r=json.load(open('$work/cold.json'))[0];print(r.get('normalize_seconds', 'n/a'))")

cat <<EOF
| measurement | seconds | ratio | notes |
|---|---|---|---|
| hand-written single-stage Dockerfile, --no-cache | $hand | 1.00 | same base, wheels and hashes; pip compiles bytecode itself |
| stackpin build --no-cache (normalised) | $cold | $(python3 -c "print(f'{$cold/$hand:.2f}')") | normalisation $norm s of it |
| stackpin build --no-cache --no-normalize | $cold_nn | $(python3 -c "print(f'{$cold_nn/$hand:.2f}')") | |
| stackpin build, nothing changed (warm) | $warm | $(python3 -c "print(f'{$warm/$hand:.2f}')") | steps cached $warm_cached (the two FROM steps print no cache line) |
| stackpin build after one stack pin change (trl) | $pin | $(python3 -c "print(f'{$pin/$hand:.2f}')") | steps cached $pin_cached |
EOF
