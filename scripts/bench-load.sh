#!/usr/bin/env bash
# Verified load against a plain load (issue 15 goal: verified / plain <= 1.05), side by side
# in one run. For each Docker 28 engine of the matrix (scripts/setup-engines.sh) and each of
# BENCH_ROUNDS rounds, every variant loads BUNDLE into a store emptied of its images:
#   plain      `zstd -dc BUNDLE/images.tar.zst | docker load`
#   LABEL      `STACKPIN bundle load BUNDLE` (verify everything, then stream the images)
# The order rotates every round, so that no variant always comes first after the emptying;
# `sync` and a pause before each load let the previous one's writeback and the store's
# garbage collection settle. Prints one Markdown row per engine and round, then per engine
# the sum over the rounds; each stackpin run's progress lines (seconds of its verify and load
# phases) go to BENCH_LOG.
#
# Usage: scripts/bench-load.sh BUNDLE LABEL=STACKPIN [LABEL=STACKPIN...]
#   e.g. scripts/bench-load.sh /tmp/cpu-bundle main=/src/main/.venv/bin/stackpin \
#        branch=.venv/bin/stackpin
# A bundle signed with --sign-key is loaded with BENCH_PUBKEY=stackpin.pub; without it,
# --insecure-unsigned (the signature check is one ed25519 verify of the manifest).
# BENCH_ENGINES="NAME..." picks engines (names from `setup-engines.sh --print-hosts`; the
# default is every engine but the shared Docker 20.10, whose images are not ours to remove).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,/^set -e/p' "$0" | sed '$d' >&2; exit 2; }
bundle=$(realpath "$1"); shift
rounds=${BENCH_ROUNDS:-2}
log=${BENCH_LOG:-$(mktemp /tmp/stackpin-bench-load.XXXXXX.log)}
trust=(--insecure-unsigned)
[ -z "${BENCH_PUBKEY:-}" ] || trust=(--pubkey "$BENCH_PUBKEY")
variants=(plain "$@")

now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
# The bundle's tags, from its manifest: what a load brings in and the emptying removes.
mapfile -t tags < <(python3 -c '
import json, sys
for image in json.load(open(sys.argv[1]))["images"]:
    print(*image["tags"], sep="\n")' "$bundle/manifest.json")

empty() {  # remove every image the bundle names, by ID (all its tags with it)
    local tag id
    for tag in "${tags[@]}"; do
        id=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null) || continue
        docker rmi -f "$id" >/dev/null
    done
    sync
    sleep "${BENCH_SETTLE_S:-5}"
}

load_one() {  # load_one VARIANT: seconds on stdout
    local variant=$1 t0 t1
    t0=$(now)
    if [ "$variant" = plain ]; then
        zstd -dc "$bundle/images.tar.zst" | docker load >/dev/null
    else
        echo "== $variant ($DOCKER_HOST)" >>"$log"
        "${variant#*=}" bundle load "${trust[@]}" "$bundle" >>"$log" 2>&1
    fi
    t1=$(now)
    for tag in "${tags[@]}"; do  # a load that left out an image is no load
        docker image inspect "$tag" >/dev/null
    done
    secs "$t0" "$t1"
}

header="| engine | round | order |"
for variant in "${variants[@]}"; do header+=" ${variant%%=*} s |"; done
for variant in "$@"; do header+=" ${variant%%=*} / plain |"; done
echo "$header"
echo "|$(printf -- '---|%.0s' $(seq 1 $((3 + ${#variants[@]} + $#))))"
while IFS='=' read -r name host; do
    if [ -n "${BENCH_ENGINES:-}" ]; then
        [[ " $BENCH_ENGINES " == *" $name "* ]] || continue
    elif [ "$name" = docker20 ]; then
        continue
    fi
    export DOCKER_HOST=$host
    declare -A total=()
    for variant in "${variants[@]}"; do total[$variant]=0; done
    for round in $(seq 1 "$rounds"); do
        declare -A took=()
        order=()
        for i in "${!variants[@]}"; do  # rotate: round r starts with variant r-1
            order+=("${variants[$(( (i + round - 1) % ${#variants[@]} ))]}")
        done
        for variant in "${order[@]}"; do
            empty
            took[$variant]=$(load_one "$variant")
            total[$variant]=$(python3 -c "print(${total[$variant]} + ${took[$variant]})")
        done
        empty
        row="| $name | $round | $(printf '%s ' "${order[@]%%=*}")|"
        for variant in "${variants[@]}"; do row+=" ${took[$variant]} |"; done
        for variant in "$@"; do row+=" $(ratio "${took[$variant]}" "${took[plain]}") |"; done
        echo "$row"
    done
    row="| $name | sum of $rounds | |"
    for variant in "${variants[@]}"; do row+=" ${total[$variant]} |"; done
    for variant in "$@"; do row+=" $(ratio "${total[$variant]}" "${total[plain]}") |"; done
    echo "$row"
done < <(bash scripts/setup-engines.sh --print-hosts)
echo "stackpin progress lines: $log" >&2
