#!/usr/bin/env bash
# Issue 20's bundle with both CUDA variants, end to end, by hand (too heavy for CI's 90
# minutes: docs/benchmarks.md), and issue 24's export-against-save pair for the CUDA images:
#   1. both variants built with BuildKit on the build engine (Docker 28, classic store);
#   2. L0 inside each image with no card (`verify --levels 0 --no-devices`);
#   3. the enhanced image's bundle alone, the two-variant bundle, and `docker save` of both
#      images, one after the other, each timed;
#   4. `bundle verify` of the two-variant bundle (signature, every checksum);
#   5. a site engine (Docker 28, containerd store) loads it with the bundle's bin/load.sh and
#      must then hold both images under the digests the signed manifest names.
# Prints sizes and ratios (two-variant bundle / enhanced alone: goal <= 1.05; export /
# save); exit 1 when the site does not hold both images.
# Usage: scripts/bench-cuda-bundle.sh WORK_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(realpath -m "${1:?usage: bench-cuda-bundle.sh WORK_DIR}")
cell=cuda130-sm90-torch2110-py311
sp=$PWD/.venv/bin/stackpin
builder=unix:///run/stackpin-engines/docker28-classic/docker.sock
site=unix:///run/stackpin-engines/docker28-containerd/docker.sock
say() { printf 'bench-cuda-bundle: %s\n' "$*"; }
timed() {  # LABEL COMMAND...: run it, then print its wall time
    local label=$1 begin=$EPOCHREALTIME
    shift
    "$@"
    say "$(awk -v a="$begin" -v b="$EPOCHREALTIME" -v l="$label" 'BEGIN { printf "%s: %.1f s", l, b - a }')"
}
bytes() { du -sb "$1" | cut -f1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

rm -rf "$work" && mkdir -p "$work"
$sp keys generate -o "$work/keys" >/dev/null
export DOCKER_HOST=$builder

say "1. build both variants (BuildKit, Docker 28 classic store)"
timed "wheels fetch" $sp wheels fetch "$cell" | tail -n 1
timed "build --variant all" $sp build "$cell" --variant all --builder buildkit
for variant in stable enhanced; do
    docker image inspect --format "$variant {{.Id}} {{.Size}} bytes" "stackpin/$cell:$variant"
done

say "2. L0 inside each image, no card"
timed "verify L0" $sp verify "$cell" --variant all --levels 0 --no-devices

say "3. bundles and save"
key=$work/keys/stackpin.key
timed "export enhanced alone" $sp bundle export "$cell" --variant enhanced -o "$work/enhanced" --sign-key "$key"
timed "export both variants" $sp bundle export "$cell" --variant all -o "$work/both" --sign-key "$key"
timed "docker save both" docker save -o "$work/save-both.tar" "stackpin/$cell:stable" "stackpin/$cell:enhanced"
alone=$(bytes "$work/enhanced") both=$(bytes "$work/both") saved=$(bytes "$work/save-both.tar")
say "sizes: enhanced alone $alone B, both $both B, save of both $saved B"
say "two-variant bundle / enhanced alone: $(ratio "$both" "$alone")"
rm -f "$work/save-both.tar"

say "4. verify the two-variant bundle"
timed "bundle verify" $sp bundle verify "$work/both" --pubkey "$work/keys/stackpin.pub"

say "5. a site (Docker 28, containerd store) loads it"
mapfile -t old < <(DOCKER_HOST=$site docker images -q "stackpin/$cell" | sort -u)
[ "${#old[@]}" = 0 ] || DOCKER_HOST=$site docker rmi -f "${old[@]}" >/dev/null
export STACKPIN_PUBKEY=$work/keys/stackpin.pub
(cd "$work/both" && DOCKER_HOST=$site timed "site load.sh" bash bin/load.sh | tail -n 3)
rc=0
for variant in stable enhanced; do
    # The signed manifest names each image by its config digest (classic store) and its
    # manifest digest (containerd store): the site's store decides which one is the ID.
    want=$(jq -r --arg v ":$variant" '.images[] | select(any(.tags[]; endswith($v)))
        | "\(.config_digest) \(.manifest_digest)"' "$work/both/manifest.json")
    have=$(DOCKER_HOST=$site docker image inspect --format '{{.Id}}' "stackpin/$cell:$variant" || true)
    if [ -n "$have" ] && [[ " $want " == *" $have "* ]]; then
        say "site holds $variant as the manifest names it: $have"
    else
        say "site holds $variant as '$have'; the signed manifest names $want" >&2
        rc=1
    fi
done
exit "$rc"
