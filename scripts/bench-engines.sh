#!/usr/bin/env bash
# Engine benchmark (issue 15), one run per engine side by side on one machine: for Docker
# 20.10, Docker 28 classic store and Docker 28 containerd image store (scripts/setup-engines.sh),
#   1. cold build of the CPU default (stackpin build --no-cache, normalised; its record
#      says how long normalisation took),
#   2. `docker save` of the image, and its size through `zstd -3`,
#   3. `stackpin bundle export` (time and images.tar.zst size),
#   4. on the Docker 28 engines only: verified load (`stackpin bundle load`) against a
#      plain `zstd -dc images.tar.zst | docker load`, each into a store emptied of the image
#      (the default engine is shared: its CPU image is not removed).
# Prints one Markdown table row per engine; ratios matter, seconds depend on the load.
# Needs: scripts/setup-host.sh --engines done, the CPU default's wheelhouse fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
sp=${STACKPIN:-$PWD/.venv/bin/stackpin}
cell=cpu-bookworm-torch2130-py311
work=$(mktemp -d /tmp/stackpin-bench-engines.XXXXXX)
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }

git clone -q --no-hardlinks . "$work/checkout"
mkdir -p "$work/checkout/wheels"
cp -al "wheels/$cell" "$work/checkout/wheels/"
cd "$work/checkout"

echo "| engine | store | cold build s | normalise s (/build) | docker save s | save MiB | zstd -3 MiB | export s (/save) | bundle MiB (/zstd -3) | verified load s | plain load s (/) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
while IFS== read -r name host; do
    export DOCKER_HOST=$host
    store=$("$sp" doctor --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["store"])')
    "$sp" wheels verify "$cell" >/dev/null
    t0=$(now); record=$("$sp" build "$cell" --no-cache --json); t1=$(now)
    build_s=$(secs "$t0" "$t1")
    norm_s=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])[0]['normalize_seconds'])" "$record")
    image=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])[0]['tags'][0])" "$record")
    t0=$(now); save_bytes=$(docker save "$image" | wc -c); t1=$(now)
    save_s=$(secs "$t0" "$t1")
    zstd_bytes=$(docker save "$image" | zstd -3 -T2 -q -c | wc -c)
    rm -rf "$work/$name"
    t0=$(now); "$sp" bundle export "$cell" -o "$work/$name" >/dev/null; t1=$(now)
    export_s=$(secs "$t0" "$t1")
    bundle_bytes=$(stat -c %s "$work/$name/images.tar.zst")
    load_cells="not measured (shared daemon) | -"
    if [ "$name" != docker20 ]; then
        image_id=$(docker image inspect --format '{{.Id}}' "$image")
        docker rmi -f "$image_id" >/dev/null
        t0=$(now); "$sp" bundle load "$work/$name" >/dev/null; t1=$(now)
        vload_s=$(secs "$t0" "$t1")
        docker rmi -f "$(docker image inspect --format '{{.Id}}' "$image")" >/dev/null
        t0=$(now); zstd -dc "$work/$name/images.tar.zst" | docker load >/dev/null; t1=$(now)
        plain_s=$(secs "$t0" "$t1")
        load_cells="$vload_s | $plain_s ($(ratio "$vload_s" "$plain_s"))"
    fi
    mib() { python3 -c "print(f'{$1 / 2**20:.0f}')"; }
    echo "| $name | $store | $build_s | $norm_s ($(ratio "$norm_s" "$build_s")) | $save_s | $(mib "$save_bytes") | $(mib "$zstd_bytes") | $export_s ($(ratio "$export_s" "$save_s")) | $(mib "$bundle_bytes") ($(ratio "$bundle_bytes" "$zstd_bytes")) | $load_cells |"
done < <(bash scripts/setup-engines.sh --print-hosts)
