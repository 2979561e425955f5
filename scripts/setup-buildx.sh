#!/usr/bin/env bash
# buildx, the maintained BuildKit client, as the host docker CLI's plugin. `stackpin build
# --builder buildkit` and the Docker tier's BuildKit tests need it on every engine, the
# default one included, and Debian bookworm packages no docker-buildx: it comes from Debian
# sid, unpacked by scripts/sid-unpack.sh (private apt state; one static Go binary).
# README command 1 (scripts/setup-host.sh) runs this; so does scripts/setup-engines.sh.
# Safe to run again: nothing is fetched when the pinned version is in place. One line.
set -euo pipefail

say() { printf 'buildx: %s\n' "$*"; }
# shellcheck source=scripts/sid-unpack.sh
. "$(dirname "$0")/sid-unpack.sh"

HOME_DIR=${STACKPIN_ENGINES_HOME:-/opt/stackpin-engines}
PACKAGE=docker-buildx=0.29.1+ds1-4     # the sid version the Docker tier was proved with
ROOT=$HOME_DIR/buildx
BINARY=$ROOT/usr/libexec/docker/cli-plugins/docker-buildx
PLUGIN=/usr/local/libexec/docker/cli-plugins/docker-buildx

[ "$(id -u)" = 0 ] || { say "must run as root (installs into $HOME_DIR and $PLUGIN)"; exit 8; }

fetch() {
    sid_unpack "$HOME_DIR/apt-buildx" "$ROOT" "$PACKAGE" || {
        say "sid no longer serves $PACKAGE: update PACKAGE in $0 to what it serves"
        exit 8
    }
    echo "$PACKAGE" >"$ROOT/.package"
}

if [ -x "$BINARY" ] && [ "$(cat "$ROOT/.package" 2>/dev/null)" = "$PACKAGE" ]; then
    :
else
    say "fetching $PACKAGE from Debian sid (private apt state in $HOME_DIR/apt-buildx)"
    fetch
fi
if [ "$(readlink "$PLUGIN" 2>/dev/null)" != "$BINARY" ]; then
    mkdir -p "$(dirname "$PLUGIN")"
    ln -sfn "$BINARY" "$PLUGIN"
fi
say "docker buildx $("$PLUGIN" version | cut -d' ' -f2) is the docker CLI's plugin ($PLUGIN)"
