#!/usr/bin/env bash
# Give back the disk that earlier builds and test runs left behind, and say what is free.
#
# Every build of a new commit leaves the previous image of that tag dangling (its labels name
# the commit), the test tier builds rebuilds, fault images and bundles, and the engine
# matrix keeps BuildKit caches of whole cells. On a host that keeps its Docker state between
# runs (a CI machine) that grows by gigabytes a run until a build stops on "no space left on
# device". This removes only what stackpin owns:
#   - on the default engine: dangling images carrying stackpin's labels and the build cache's
#     uploaded contexts (tagged images, their layer cache and everything else on the engine
#     stay);
#   - on the matrix engines of scripts/setup-engines.sh (their data-roots are stackpin's own):
#     stopped containers, every image and the whole build cache;
#   - pytest's temporary folders of earlier runs (bundles of 1-2 GB each);
#   - the layer frames that bundle exports keep in stackpin's machine cache.
# Not while a build or test run is in progress: its intermediate images would be removed.
#
# Usage: scripts/reclaim-disk.sh [--need GIB [--or-prune-cache]] [--keep-test-temp]
#   --need GIB        exit 8 when, after reclaiming, less than GIB GiB is free where Docker
#                     keeps its data (the disk the builds fill).
#   --or-prune-cache  with --need: when that is not free, give back the default engine's
#                     whole build cache too (only a cache: the next build is cold) before
#                     judging. CI's choice: a cold run beats a refused one.
#   --keep-test-temp  leave pytest's folders (after a run: what its failed tests left).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'reclaim: %s\n' "$*"; }

need_gib=0
keep_test_temp=0
or_prune_cache=0
while (($#)); do
    case $1 in
        --need) (($# > 1)) || { say "--need takes a whole number of GiB"; exit 2; }
                need_gib=$2; shift 2 ;;
        --keep-test-temp) keep_test_temp=1; shift ;;
        --or-prune-cache) or_prune_cache=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) say "unknown argument $1 (see --help)"; exit 2 ;;
    esac
done
[[ $need_gib =~ ^[0-9]{1,7}$ ]] || { say "--need takes a whole number of GiB (at most 7 digits), not '$need_gib'"; exit 2; }

data_root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null) || {
    say "no Docker daemon answers: start one (scripts/setup-host.sh) and rerun"; exit 8; }
free_gib() { df -P -BG "$data_root" | awk 'NR==2 {sub("G","",$4); print $4}'; }
before=$(free_gib)

# Dangling only (no -a): the current tags and the layers they share stay warm.
docker image prune -f --filter label=io.stackpin.bootstrap-digest >/dev/null
# BuildKit builds get their context as a tar on stdin (stackpin.engine.buildx), which the
# engine keeps as a cache record per build ("http url http://buildkit-session/..."): 3 GB for
# the CUDA cell's wheels, never used again once the context changes. Given back when no
# build uses it; the layers built from it stay.
docker builder prune -f --filter 'description~=buildkit-session' >/dev/null 2>&1 || true

while IFS='=' read -r name host; do
    [ "$name" = docker20 ] && continue  # the default engine, handled above
    if DOCKER_HOST=$host docker info >/dev/null 2>&1; then
        # Containers, images and (on these BuildKit engines) the build cache in one call.
        DOCKER_HOST=$host docker system prune -af >/dev/null
    fi
done < <(bash scripts/setup-engines.sh --print-hosts)

tmp_root=${TMPDIR:-/tmp}/pytest-of-$(id -un)
if ((!keep_test_temp)) && [ -d "$tmp_root" ]; then rm -rf "$tmp_root"; fi
# The layer frames bundle exports keep (stackpin.bundle.framecache, up to 4 GiB): only a
# cache, the next export compresses anew. Its folder is where stackpin says it is.
if [ -x .venv/bin/python ]; then
    cache=$(.venv/bin/python -c 'from stackpin.cache import cache_dir; print(cache_dir())')
    rm -rf "$cache/frames"
fi

after=$(free_gib)
if ((after < need_gib && or_prune_cache)); then
    say "$after GiB free, $need_gib needed: giving back the default engine's build cache too"
    docker builder prune -af >/dev/null 2>&1 || true
    after=$(free_gib)
fi
say "$after GiB free on the disk of $data_root (was $before GiB)"
if ((after < need_gib)); then
    say "the build and test tiers need $need_gib GiB free there: remove other images" \
        "(docker image ls) or files on that disk, then rerun"
    exit 8
fi
