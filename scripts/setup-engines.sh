#!/usr/bin/env bash
# The engine matrix beside the host's default Docker: Docker 28 with the classic store and
# Docker 28 with the containerd image store (the default of a fresh Docker 29), each with
# its own containerd, socket, data-root, exec-root and pidfile, in its own network namespace.
#
# Engines come from Debian sid (docker.io, docker-cli, containerd), fetched with `apt-get
# download` through a PRIVATE sources list, list state and cache (the system's apt setup is
# left alone) and unpacked with `dpkg -x`; runc is the host's (bookworm's: sid's needs a
# newer glibc). buildx, the host CLI's plugin, is scripts/setup-buildx.sh's (run here too).
#
# Safe to run again, and after every process was killed: each step is skipped when done,
# stale pidfiles and sockets are replaced. One line per step. Prints nothing else on success.
# Usage: scripts/setup-engines.sh [--print-hosts]   (the second form prints NAME=DOCKER_HOST
# lines for the running matrix, the default engine first; .ci/run exports them).
set -euo pipefail

say() { printf 'engines: %s\n' "$*"; }
# shellcheck source=scripts/sid-unpack.sh
. "$(dirname "$0")/sid-unpack.sh"

HOME_DIR=${STACKPIN_ENGINES_HOME:-/opt/stackpin-engines}   # binaries (kept between runs)
STATE_DIR=${STACKPIN_ENGINES_STATE:-/var/lib/stackpin-engines}  # data-roots
RUN_DIR=${STACKPIN_ENGINES_RUN:-/run/stackpin-engines}      # sockets, exec-roots, pidfiles
# The sid versions this matrix was proved with; another version in sid is refused below.
PACKAGES=(docker.io=28.5.2+dfsg4-5 docker-cli=28.5.2+dfsg4-5 containerd=2.1.9+ds1-5)
# name, containerd image store (true/false)
ENGINES=("docker28-classic false" "docker28-containerd true")
ROOT=$HOME_DIR/root
BIN_PATH=$ROOT/usr/sbin:$ROOT/usr/bin:/usr/sbin:/usr/bin:/sbin:/bin

host_of() { printf 'unix://%s/%s/docker.sock' "$RUN_DIR" "$1"; }

if [ "${1:-}" = --print-hosts ]; then
    # The default engine is the one the docker CLI talks to (DOCKER_HOST when set): the
    # matrix must not test another daemon than the rest of the run builds on.
    echo "docker20=${DOCKER_HOST:-unix:///var/run/docker.sock}"
    for entry in "${ENGINES[@]}"; do
        read -r name _ <<<"$entry"
        echo "$name=$(host_of "$name")"
    done
    exit 0
fi

[ "$(id -u)" = 0 ] || { say "must run as root (network namespaces, dockerd)"; exit 8; }
for tool in apt-get dpkg ip nsenter runc; do
    command -v "$tool" >/dev/null || { say "$tool not found: apt-get install it and rerun"; exit 8; }
done

fetch_packages() {
    sid_unpack "$HOME_DIR/apt" "$ROOT" "${PACKAGES[@]}" || {
        say "sid no longer serves ${PACKAGES[*]}: update PACKAGES in $0 to what it serves"
        exit 8
    }
    printf '%s\n' "${PACKAGES[@]}" >"$HOME_DIR/packages"
}

if [ -x "$ROOT/usr/sbin/dockerd" ] && [ "$(cat "$HOME_DIR/packages" 2>/dev/null)" = "$(printf '%s\n' "${PACKAGES[@]}")" ]; then
    say "sid engines present in $ROOT ($("$ROOT/usr/sbin/dockerd" --version | cut -d, -f1))"
else
    say "fetching ${PACKAGES[*]} from Debian sid (private apt state in $HOME_DIR/apt)"
    fetch_packages
fi

# buildx for the host's docker CLI (a maintained BuildKit client; the bake file is built with it).
bash "$(dirname "$0")/setup-buildx.sh"

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for WHAT LOG COMMAND...: up to 60 s
    local what=$1 log=$2
    shift 2
    for _ in $(seq 120); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    say "$what did not come up; its log: $log"
    tail -n 5 "$log" | sed 's/^/engines:   /'
    exit 8
}

start_engine() {  # start_engine NAME CONTAINERD_STORE
    local name=$1 snapshotter=$2
    local run=$RUN_DIR/$name state=$STATE_DIR/$name netns=stackpin-$name
    local sock=$run/docker.sock ctr_sock=$run/containerd/containerd.sock
    mkdir -p "$run/containerd" "$state/containerd" "$state/docker"
    [ -e "/run/netns/$netns" ] || ip netns add "$netns"
    nsenter --net="/run/netns/$netns" ip link set lo up
    # containerd (its own; the host's belongs to the default daemon), without the CRI plugin.
    cat >"$run/containerd/config.toml" <<EOF
version = 3
root = "$state/containerd"
state = "$run/containerd/state"
disabled_plugins = ["io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"]
[grpc]
  address = "$ctr_sock"
EOF
    if ! alive "$run/containerd.pid"; then
        rm -f "$ctr_sock" "$ctr_sock.ttrpc"
        nsenter --net="/run/netns/$netns" env PATH="$BIN_PATH" \
            setsid containerd --config "$run/containerd/config.toml" \
            >"$state/containerd.log" 2>&1 </dev/null &
        echo $! >"$run/containerd.pid"
        wait_for "containerd of $name" "$state/containerd.log" \
            env PATH="$BIN_PATH" ctr --address "$ctr_sock" version
    fi
    printf '{"features": {"containerd-snapshotter": %s}}\n' "$snapshotter" >"$run/daemon.json"
    if ! alive "$run/docker.pid"; then
        rm -f "$sock" "$run/docker.pid"
        # nsenter, not `ip netns exec`: the latter remounts /sys and hides the cgroup mounts.
        nsenter --net="/run/netns/$netns" env PATH="$BIN_PATH" \
            setsid dockerd --host "unix://$sock" --data-root "$state/docker" \
            --exec-root "$run/exec" --pidfile "$run/docker.pid" --containerd "$ctr_sock" \
            --config-file "$run/daemon.json" >"$state/dockerd.log" 2>&1 </dev/null &
        wait_for "dockerd $name" "$state/dockerd.log" \
            env PATH="$BIN_PATH" docker -H "unix://$sock" info
    fi
    local version store=classic
    version=$(PATH="$BIN_PATH" docker -H "unix://$sock" version --format '{{.Server.Version}}')
    [ "$snapshotter" = true ] && store=containerd
    say "$name up at unix://$sock (Docker $version, $store image store)"
}

for entry in "${ENGINES[@]}"; do
    read -r name snapshotter <<<"$entry"
    start_engine "$name" "$snapshotter"
done
