#!/usr/bin/env bash
# Issue 24's comparisons in one run, per engine, each pair's two runs back to back:
#   1. cold build: `stackpin build --no-cache` of the CPU default against the same installs
#      in scripts/bench-handwritten.Dockerfile, built cold with BuildKit
#      (docker buildx build --no-cache --network none) in stackpin's own staged context;
#      rounds alternate which of the two goes first;
#   2. whole `stackpin bundle export` against `docker save -o` of the same image, rounds
#      alternating the order: first `--no-cache` (every layer compressed), then with the
#      frames an untimed export kept (stackpin.bundle.framecache; on Engine 20.10 found by
#      each layer.tar's size and first MiB);
#   3. bundle size: images.tar.zst against `zstd -3` of the saved tar; then the verified
#      `stackpin bundle load` against `zstd -dc images.tar.zst | docker load`, each into a
#      store without the image (removed before every load), rounds alternating the order
#      (BENCH_LOAD_ROUNDS, default 2);
#   4. warm rebuild after one stack pin change (python-docx 1.2.0 -> 1.1.2, locked and fetched
#      before any timing), each on the cache its cold builds left: stackpin build against
#      the hand-written Dockerfile in the changed context (one round: a second would be
#      cached whole); then the changed image's export, with the frames of the first image's
#      exports kept, against its `docker save -o` (one pair).
# The cell is the CPU default renamed (BENCH_CELL, its lock rewritten to match), so the
# shared engine's CPU tags are never moved; its images are removed after each engine.
# Prints every run's seconds as it ends, then one Markdown row per engine (ratios of the
# medians). Ratios matter; seconds depend on the machine's load.
# BENCH_ENGINES="NAME..." runs a subset (names from `setup-engines.sh --print-hosts`);
# BENCH_ROUNDS (default 1) cold-build rounds, BENCH_EXPORT_ROUNDS (default 2) export rounds;
# BENCH_BUILDER (default auto) is stackpin build's --builder; BENCH_WARM=0 skips the warm
# pin-change pair; BENCH_UV=1 adds the uv yardstick (scripts/bench-handwritten-uv.Dockerfile)
# after the last cold pair. BENCH_ONLY=export builds the image once, untimed, and runs only
# the export pairs and the size (item 2 and the size of item 3).
# Needs: scripts/setup-host.sh --engines done (buildx), the CPU default's wheelhouse
# fetched, the index reachable (the changed pin's lock and wheel, before any timing).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
sp=${STACKPIN:-$root/.venv/bin/stackpin}
py=$root/.venv/bin/python
cell=cpu-bookworm-torch2130-py311
bench=${BENCH_CELL:-bench-bookworm-py311}
work=$(mktemp -d /tmp/stackpin-bench-speed.XXXXXX)
# A failed step's output is in the log: show its end before the folder goes.
trap 'status=$?; [ "$status" = 0 ] || tail -n 40 "$work/log" >&2; rm -rf "$work"' EXIT

now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }
median() { python3 -c "import statistics,sys; print(f'{statistics.median(map(float, sys.argv[1:])):.1f}')" "$@"; }
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0][sys.argv[2]])" "$1" "$2"; }
timed() {  # timed VAR COMMAND...: run it, its output to the log, its seconds into VAR
    local var=$1 t0 t1; shift
    t0=$(now); "$@" >>"$work/log" 2>&1; t1=$(now)
    printf -v "$var" '%s' "$(secs "$t0" "$t1")"
}

# A checkout of HEAD whose CPU cell is BENCH_CELL, sharing the wheelhouse by hard links.
project() {  # project DEST
    git clone -q --no-hardlinks "$root" "$1"
    mkdir -p "$1/wheels" && cp -al "$root/wheels/$cell" "$1/wheels/$bench"
    cp -al "$root/wheels/tools" "$1/wheels/tools"  # the pinned installer (pinning/tools/)
    sed -i "s/$cell/$bench/g" "$1/pinning/cpu.toml"
    (cd "$1" && PYTHONPATH=$1/src "$py" - "$cell" "$bench" <<'EOF'
import json, sys
from pathlib import Path
from stackpin.lock import cell_digest
from stackpin.matrixfile import load_cells
old, new = sys.argv[1:]
cells = load_cells(sorted(Path("pinning").glob("*.toml")))
lock = json.loads(Path(f"pinning/locks/{old}.lock").read_text())
lock.update(cell=new, cell_digest=cell_digest(cells[new]))
Path(f"pinning/locks/{new}.lock").write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
EOF
    )
}

cold_rounds=${BENCH_ROUNDS:-1}
[ "${BENCH_ONLY:-}" != export ] || cold_rounds=0 BENCH_WARM=0
project "$work/a"
# The code under test is the clone's (HEAD), not the worktree's editable install, so edits
# made while the benchmark runs never reach it.
export PYTHONPATH=$work/a/src
if [ "${BENCH_WARM:-1}" != 0 ]; then  # the one-pin change: a leaf of the stack, no shim on it
    cp -al "$work/a" "$work/pin"  # files are replaced, never written through, below
    sed -i 's/^python-docx = "1.2.0"/python-docx = "1.1.2"/' "$work/pin/pinning/cpu.toml"
    grep -q '^python-docx = "1.1.2"' "$work/pin/pinning/cpu.toml"
    (cd "$work/pin" && "$sp" lock "$bench" >>"$work/log" 2>&1 && "$sp" wheels fetch "$bench" >>"$work/log" 2>&1)
fi
hand() {  # hand PROJECT TAG [--no-cache]: the pip yardstick
    yardstick bench-handwritten.Dockerfile "$@"
}
hand_uv() {  # hand_uv PROJECT TAG [--no-cache]: the uv yardstick
    yardstick bench-handwritten-uv.Dockerfile "$@"
}
yardstick() {  # yardstick DOCKERFILE PROJECT TAG [--no-cache]
    local context=$2/build/context/$bench-stable base wheel
    base=$(sed -n 's/^FROM \([^ ]*\).*/\1/p' "$context/Dockerfile" | tail -n 1)
    wheel=$(basename "$(ls "$context"/tools/uv-*.whl)")
    docker buildx build --builder default "${@:4}" --network none --progress plain \
        -f "$root/scripts/$1" --build-arg "BASE=$base" --build-arg "UV_WHEEL=$wheel" \
        -t "$3" "$context"
}

# The yardstick must install exactly what stackpin does, or its time means nothing (it once
# installed only two of the four wheel layers after the stack was split, and looked 4x faster).
same_installs() {  # same_installs STACKPIN_IMAGE HANDWRITTEN_IMAGE
    local ours theirs
    ours=$(docker run --rm --network none --entrypoint /opt/stackpin/venv/bin/python "$1" \
        -m pip list --format=freeze | sort)
    theirs=$(docker run --rm --network none --entrypoint /opt/venv/bin/python "$2" \
        -m pip list --format=freeze | sort)
    if [ "$ours" != "$theirs" ]; then
        echo "bench: the hand-written image installs other distributions than stackpin's:" >&2
        diff <(echo "$ours") <(echo "$theirs") | head -n 20 >&2
        exit 1
    fi
    echo "same installs in both images: $(echo "$ours" | wc -l) distributions"
}

gone() {  # gone IMAGE: the image and every tag of it removed, so a load brings it back whole
    docker rmi -f "$1" >/dev/null 2>&1 || true
    sync
}

rows=()
while IFS='=' read -r name host; do
    case " ${BENCH_ENGINES:-$name} " in *" $name "*) ;; *) continue ;; esac
    export DOCKER_HOST=$host
    store=$("$sp" doctor --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["store"])')
    for p in a pin; do
        [ -d "$work/$p" ] || continue
        (cd "$work/$p" && "$sp" build "$bench" --prepare-only >>"$work/log" 2>&1)
    done
    hand_tag=stackpin-bench-speed/handwritten:$name
    sp_cold=() hand_cold=() sp_export=() save=() kept_export=() kept_save=()
    frames=$("$py" -c 'from stackpin.cache import cache_dir; print(cache_dir())')/frames
    rm -rf "$frames"
    if [ "${BENCH_ONLY:-}" = export ]; then  # one untimed build to export
        (cd "$work/a" && "$sp" build "$bench" --builder "${BENCH_BUILDER:-auto}" --json >"$work/cold.json" 2>>"$work/log")
    fi
    for round in $(seq 1 "$cold_rounds"); do
        a() { (cd "$work/a" && "$sp" build "$bench" --no-cache --builder "${BENCH_BUILDER:-auto}" --json >"$work/cold.json"); }
        b() { hand "$work/a" "$hand_tag" --no-cache; }
        if [ $((round % 2)) = 1 ]; then timed s a; timed h b; else timed h b; timed s a; fi
        sp_cold+=("$s") hand_cold+=("$h")
        echo "$name cold round $round: stackpin $s s ($(field "$work/cold.json" builder), timestamps $(field "$work/cold.json" timestamps) in $(field "$work/cold.json" normalize_seconds) s, image $(field "$work/cold.json" image_id)), hand-written $h s"
    done
    if [ "${BENCH_UV:-0}" = 1 ]; then  # the uv yardstick, right after the last cold pair
        timed hu hand_uv "$work/a" "$hand_tag-uv" --no-cache
        echo "$name cold, uv yardstick: hand-written with uv $hu s (stackpin's last cold build $s s: $(ratio "$s" "$hu"))"
        docker rmi -f "$hand_tag-uv" >/dev/null
    fi
    image=$(field "$work/cold.json" image_id)
    [ "$cold_rounds" = 0 ] || same_installs "$image" "$hand_tag"
    for round in $(seq 1 "${BENCH_EXPORT_ROUNDS:-2}"); do
        rm -rf "$work/bundle" "$work/save.tar"
        a() { (cd "$work/a" && "$sp" bundle export "$bench" --no-cache -o "$work/bundle"); }
        b() { docker save "$image" -o "$work/save.tar"; }
        if [ $((round % 2)) = 1 ]; then timed e a; timed v b; else timed v b; timed e a; fi
        sp_export+=("$e") save+=("$v")
        echo "$name export round $round: bundle export --no-cache $e s, docker save $v s ($(( $(stat -c %s "$work/save.tar") >> 20 )) MiB)"
    done
    cold_sum=$(sha256sum <"$work/bundle/images.tar.zst")
    (cd "$work/a" && "$sp" bundle export "$bench" -o "$work/bundle" --force >>"$work/log" 2>&1)
    for round in $(seq 1 "${BENCH_EXPORT_ROUNDS:-2}"); do
        rm -rf "$work/bundle" "$work/save.tar"
        a() { (cd "$work/a" && "$sp" bundle export "$bench" -o "$work/bundle"); }
        b() { docker save "$image" -o "$work/save.tar"; }
        if [ $((round % 2)) = 1 ]; then timed e a; timed v b; else timed v b; timed e a; fi
        kept_export+=("$e") kept_save+=("$v")
        echo "$name export round $round, frames kept: bundle export $e s ($(find "$frames" -name '*.zst' 2>/dev/null | wc -l) frames kept), docker save $v s"
    done
    # The kept frames must not change a byte of the bundle.
    [ "$(sha256sum <"$work/bundle/images.tar.zst")" = "$cold_sum" ] || {
        echo "bench: the export with kept frames wrote other bytes than --no-cache" >&2; exit 1; }
    zstd -q -3 -T2 "$work/save.tar" -o "$work/save.tar.zst"
    bz=$(stat -c %s "$work/bundle/images.tar.zst") zs=$(stat -c %s "$work/save.tar.zst")
    echo "$name size: bundle images.tar.zst $bz B, zstd -3 of the save $zs B"
    rm -f "$work/save.tar" "$work/save.tar.zst"
    # What the image is made of, comparable across engines (the classic store names images by
    # config digest, the containerd store by manifest digest): the sha256 of its layer list.
    # Before the loads: on the containerd store a loaded bundle's image has another ID.
    echo "$name layers of the cold build: $(docker image inspect --format '{{json .RootFS.Layers}}' "$image")"
    sp_load=() plain_load=()
    if [ "$cold_rounds" = 0 ]; then
        rm -rf "$work/bundle"
        rows+=("| $name | $store | not run | not run | $(median "${sp_export[@]}") / $(median "${save[@]}") = $(ratio "$(median "${sp_export[@]}")" "$(median "${save[@]}")") | $(median "${kept_export[@]}") / $(median "${kept_save[@]}") = $(ratio "$(median "${kept_export[@]}")" "$(median "${kept_save[@]}")") | not run | not run | $(ratio "$bz" "$zs") |")
        docker images -q --filter "label=io.stackpin.cell=$bench" | sort -u | xargs -r docker rmi -f >/dev/null
        continue
    fi
    for round in $(seq 1 "${BENCH_LOAD_ROUNDS:-2}"); do
        a() { gone "$image"; (cd "$work/a" && "$sp" bundle load --insecure-unsigned "$work/bundle"); }
        b() { gone "$image"; zstd -dc "$work/bundle/images.tar.zst" | docker load; }
        if [ $((round % 2)) = 1 ]; then timed l a; timed p b; else timed p b; timed l a; fi
        sp_load+=("$l") plain_load+=("$p")
        echo "$name load round $round: verified bundle load $l s, zstd -dc | docker load $p s"
    done
    rm -rf "$work/bundle"
    if [ "${BENCH_WARM:-1}" = 0 ]; then
        w=- hw=-
        rows+=("| $name | $store | $(median "${sp_cold[@]}") / $(median "${hand_cold[@]}") = $(ratio "$(median "${sp_cold[@]}")" "$(median "${hand_cold[@]}")") | not run (BENCH_WARM=0) | $(median "${sp_export[@]}") / $(median "${save[@]}") = $(ratio "$(median "${sp_export[@]}")" "$(median "${save[@]}")") | $(median "${kept_export[@]}") / $(median "${kept_save[@]}") = $(ratio "$(median "${kept_export[@]}")" "$(median "${kept_save[@]}")") | not run | $(median "${sp_load[@]}") / $(median "${plain_load[@]}") = $(ratio "$(median "${sp_load[@]}")" "$(median "${plain_load[@]}")") | $(ratio "$bz" "$zs") |")
        docker images -q --filter "label=io.stackpin.cell=$bench" | sort -u | xargs -r docker rmi -f >/dev/null
        docker rmi -f "$hand_tag" >/dev/null
        continue
    fi
    timed w bash -c "cd '$work/pin' && '$sp' build '$bench' --builder '${BENCH_BUILDER:-auto}' --json >'$work/pin.json'"
    timed hw hand "$work/pin" "$hand_tag-pin"
    echo "$name warm after one pin change: stackpin $w s (steps cached $(field "$work/pin.json" cached_steps)/$(field "$work/pin.json" steps)), hand-written $hw s"
    pin_image=$(field "$work/pin.json" image_id)
    timed pe bash -c "cd '$work/pin' && '$sp' bundle export '$bench' -o '$work/pin-bundle'"
    timed ps docker save "$pin_image" -o "$work/save.tar"
    echo "$name export after the pin change, the first image's frames kept: bundle export $pe s, docker save $ps s"
    rm -rf "$work/pin-bundle" "$work/save.tar"
    docker images -q --filter "label=io.stackpin.cell=$bench" | sort -u | xargs -r docker rmi -f >/dev/null
    docker rmi -f "$hand_tag" "$hand_tag-pin" >/dev/null
    c=$(median "${sp_cold[@]}") hc=$(median "${hand_cold[@]}") x=$(median "${sp_export[@]}") sv=$(median "${save[@]}")
    l=$(median "${sp_load[@]}") p=$(median "${plain_load[@]}")
    kx=$(median "${kept_export[@]}") ks=$(median "${kept_save[@]}")
    rows+=("| $name | $store | $c / $hc = $(ratio "$c" "$hc") | $w / $hw = $(ratio "$w" "$hw") | $x / $sv = $(ratio "$x" "$sv") | $kx / $ks = $(ratio "$kx" "$ks") | $pe / $ps = $(ratio "$pe" "$ps") | $l / $p = $(ratio "$l" "$p") | $(ratio "$bz" "$zs") |")
done < <(bash scripts/setup-engines.sh --print-hosts)

echo
echo "| engine | store | cold build s: stackpin / hand-written | warm after one pin change s | bundle export --no-cache / docker save s | export, frames kept / docker save s | export after the pin change / docker save s | verified load / plain load s | bundle / zstd -3 size |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
