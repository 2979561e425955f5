#!/usr/bin/env bash
# Engine benchmark (issue 15), one run per engine side by side on one machine: for Docker
# 20.10, Docker 28 classic store and Docker 28 containerd image store (scripts/setup-engines.sh),
#   1. cold build of the CPU default (stackpin build --no-cache, builder auto: BuildKit on
#      Docker 28, classic on 20.10; its record says whether the timestamps were normalised
#      and how long that took, or rewritten natively by the engine),
#   2. the same installs from a hand-written Dockerfile (one COPY of the staged wheelhouse,
#      one pip install) built cold with BuildKit (docker buildx build --no-cache),
#   3. `docker save` of the image, and its size through `zstd -3`,
#   4. `stackpin bundle export` (time and images.tar.zst size),
#   5. verified load (`stackpin bundle load`) against a plain
#      `zstd -dc images.tar.zst | docker load`: on the Docker 28 engines each into a store
#      emptied of the image; on the shared default engine with the image present (others'
#      CPU images are never removed), which both loads then mostly skip.
#      One sample each, verified first: scripts/bench-load.sh measures this ratio in
#      rounds whose order rotates.
# Prints one Markdown table row per engine; ratios matter, seconds depend on the load.
# BENCH_ENGINES="NAME..." runs a subset (names from `setup-engines.sh --print-hosts`);
# BENCH_COLD=0 builds with the cache (the build columns then say "warm").
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
mib() { python3 -c "print(f'{$1 / 2**20:.0f}')"; }
field() { python3 -c "import json,sys; v = json.loads(sys.argv[1])[0][sys.argv[2]]; print(v[0] if isinstance(v, list) else v)" "$1" "$2"; }
image_id() { docker image inspect --format '{{.Id}}' "$1"; }

git clone -q --no-hardlinks . "$work/checkout"
mkdir -p "$work/checkout/wheels"
cp -al "wheels/$cell" "$work/checkout/wheels/"
cd "$work/checkout"

# The hand-written Dockerfile: what one would write for the same installs.
handwritten() {  # handwritten BASE
    printf '%s\n' "FROM $1" "COPY wheels/ /tmp/wheels/" \
        "RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-index --no-deps \\" \
        "      --find-links /tmp/wheels/vendor --find-links /tmp/wheels/stack \\" \
        "      -r /tmp/wheels/vendor/requirements.txt -r /tmp/wheels/stack/requirements.txt \\" \
        "    && rm -rf /tmp/wheels"
}

echo "| engine | store | builder | cold build s | hand-written BuildKit s (build /) | timestamps: normalise s (/ build) | docker save s | save MiB | zstd -3 MiB | export s (/ save) | bundle MiB (/ zstd -3) | verified load s | plain load s (verified /) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
while IFS== read -r name host; do
    case " ${BENCH_ENGINES:-$name} " in *" $name "*) ;; *) continue ;; esac
    export DOCKER_HOST=$host
    store=$("$sp" doctor --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["store"])')
    "$sp" wheels verify "$cell" >/dev/null
    cold=(--no-cache)
    [ "${BENCH_COLD:-1}" = 1 ] || cold=()
    t0=$(now); record=$("$sp" build "$cell" "${cold[@]}" --json 2>/dev/null); t1=$(now)
    build_s=$(secs "$t0" "$t1")
    norm_s=$(field "$record" normalize_seconds)
    image=$(field "$record" tags)
    timestamps="$(field "$record" timestamps): $norm_s ($(ratio "$norm_s" "$build_s"))"
    builder=$(field "$record" builder)
    hand_s=warm
    if [ "${BENCH_COLD:-1}" = 1 ]; then
        context=build/context/$cell-stable
        handwritten "$(sed -n 's/^FROM \([^ ]*\).*/\1/p' "$context/Dockerfile" | head -n 1)" \
            >"$work/handwritten.Dockerfile"
        t0=$(now)
        docker buildx build --builder default --no-cache --network none --progress quiet \
            -f "$work/handwritten.Dockerfile" -t "stackpin-bench/handwritten:$name" \
            "$context" >/dev/null
        t1=$(now)
        hand_s="$(secs "$t0" "$t1") ($(ratio "$build_s" "$(secs "$t0" "$t1")"))"
        docker rmi "stackpin-bench/handwritten:$name" >/dev/null
    else
        build_s=warm
    fi
    t0=$(now); save_bytes=$(docker save "$image" | wc -c); t1=$(now)
    save_s=$(secs "$t0" "$t1")
    zstd_bytes=$(docker save "$image" | zstd -3 -T2 -q -c | wc -c)
    rm -rf "$work/$name"
    t0=$(now); "$sp" bundle export "$cell" -o "$work/$name" >/dev/null 2>&1; t1=$(now)
    export_s=$(secs "$t0" "$t1")
    bundle_bytes=$(stat -c %s "$work/$name/images.tar.zst")
    shared=""
    [ "$name" = docker20 ] && shared=" (image present)"
    [ -n "$shared" ] || docker rmi -f "$(image_id "$image")" >/dev/null
    t0=$(now); "$sp" bundle load --insecure-unsigned "$work/$name" >/dev/null 2>&1; t1=$(now)
    vload_s=$(secs "$t0" "$t1")
    [ -n "$shared" ] || docker rmi -f "$(image_id "$image")" >/dev/null
    t0=$(now); zstd -dc "$work/$name/images.tar.zst" | docker load >/dev/null; t1=$(now)
    plain_s=$(secs "$t0" "$t1")
    # The Docker 28 engines are this project's own: leave them without the bench image.
    [ -n "$shared" ] || docker rmi -f "$(image_id "$image")" >/dev/null
    echo "| $name | $store | $builder | $build_s | $hand_s | $timestamps | $save_s | $(mib "$save_bytes") | $(mib "$zstd_bytes") | $export_s ($(ratio "$export_s" "$save_s")) | $(mib "$bundle_bytes") ($(ratio "$bundle_bytes" "$zstd_bytes")) | $vload_s$shared | $plain_s ($(ratio "$vload_s" "$plain_s")) |"
done < <(bash scripts/setup-engines.sh --print-hosts)
