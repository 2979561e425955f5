#!/usr/bin/env bash
# Issue 25's delta figure, end to end, with real builds and real sites:
#   1. build the CPU default (BuildKit, on the build engine) and export its full bundle;
#   2. each site engine (one per Docker image store) loads that bundle and writes its
#      inventory (bin/inventory.sh), as a site that holds the previous image would;
#   3. in a git worktree of HEAD, one stack pin changes (PIN=NAME==VERSION), `stackpin lock`
#      re-locks (holding every other version), the wheels are fetched and the image built;
#   4. the new image's full bundle and, per site, its delta (`bundle export --against`);
#   5. each site loads its delta (bin/load.sh: signature, checksums, the layers it relies
#      on present) and must then hold the new image under the ID the signed manifest names.
# Prints the sizes and ratios; exit 1 when a site does not end with the new image.
# Usage: scripts/bench-delta.sh WORK_DIR [PIN]   (default PIN: peft==0.21.2)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(realpath -m "${1:?usage: bench-delta.sh WORK_DIR [PIN]}")
pin=${2:-peft==0.21.2}
name=${pin%%==*} version=${pin#*==}
cell=cpu-bookworm-torch2130-py311
sp=$root/.venv/bin/stackpin
builder=unix:///run/stackpin-engines/docker28-classic/docker.sock
declare -A sites=([docker28-containerd]=unix:///run/stackpin-engines/docker28-containerd/docker.sock
                  [docker20-classic]=unix:///var/run/docker.sock)
say() { printf 'bench-delta: %s\n' "$*"; }
size() { stat -c %s "$1"; }
grep -q "^$name = \"" pinning/cpu.toml || { echo "bench-delta: $name is not a stack pin of $cell" >&2; exit 2; }

rm -rf "$work" && mkdir -p "$work"
$sp keys generate -o "$work/keys" >/dev/null
export STACKPIN_PUBKEY=$work/keys/stackpin.pub
export DOCKER_HOST=$builder

say "1. the current lock: build and full bundle"
$sp wheels fetch "$cell" | tail -n 1
$sp build "$cell" --builder buildkit | grep '^build:'
$sp bundle export "$cell" -o "$work/old" --sign-key "$work/keys/stackpin.key" --force >/dev/null

for site in "${!sites[@]}"; do
    say "2. site $site loads the old bundle and writes its inventory"
    mapfile -t old_ids < <(DOCKER_HOST=${sites[$site]} docker images -q "stackpin/$cell" | sort -u)
    [ "${#old_ids[@]}" = 0 ] || DOCKER_HOST=${sites[$site]} docker rmi -f "${old_ids[@]}" >/dev/null
    (cd "$work/old" && DOCKER_HOST=${sites[$site]} bash bin/load.sh | tail -n 1 \
        && DOCKER_HOST=${sites[$site]} bash bin/inventory.sh -o "$work/$site.inventory" | tail -n 1)
done

say "3. one pin changed: $name $version, re-locked in a worktree of HEAD"
tree=$work/tree
git worktree add --detach "$tree" HEAD >/dev/null
trap 'git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
ln -s "$root/.venv" "$tree/.venv"
sed -i "s/^$name = \"[^\"]*\"/$name = \"$version\"/" "$tree/pinning/cpu.toml"
(cd "$tree" && $sp lock "$cell" && $sp wheels fetch "$cell" | tail -n 1 \
    && $sp build "$cell" --builder buildkit | grep '^build:' \
    && $sp bundle export "$cell" -o "$work/new" --sign-key "$work/keys/stackpin.key" --force >/dev/null)
for site in "${!sites[@]}"; do
    (cd "$tree" && $sp bundle export "$cell" -o "$work/delta-$site" --force \
        --sign-key "$work/keys/stackpin.key" --against "$work/$site.inventory" >/dev/null)
done

say "4. sizes"
full=$(size "$work/new/images.tar.zst")
full_dir=$(du -sb "$work/new" | cut -f1)
rc=0
for site in "${!sites[@]}"; do
    part=$(size "$work/delta-$site/images.tar.zst")
    part_dir=$(du -sb "$work/delta-$site" | cut -f1)
    awk -v s="$site" -v p="$part" -v f="$full" -v pd="$part_dir" -v fd="$full_dir" 'BEGIN {
        printf "delta for %s: images.tar.zst %d of %d bytes (%.2f %%); whole bundle %d of %d bytes (%.2f %%)\n",
               s, p, f, 100 * p / f, pd, fd, 100 * pd / fd }'
    say "5. site $site loads its delta"
    (cd "$work/delta-$site" && DOCKER_HOST=${sites[$site]} bash bin/load.sh)
    # The signed manifest names the image by its config digest (classic store) and its
    # manifest digest (containerd store): the store decides which one is the ID.
    want=$(jq -r '.images[0] | "\(.config_digest) \(.manifest_digest)"' "$work/delta-$site/manifest.json")
    have=$(DOCKER_HOST=${sites[$site]} docker image inspect --format '{{.ID}}' "stackpin/$cell:stable")
    if [[ " $want " == *" $have "* ]]; then
        say "site $site holds the new image $have"
    else
        say "site $site holds $have, the signed manifest names $want" >&2
        rc=1
    fi
done
exit "$rc"
