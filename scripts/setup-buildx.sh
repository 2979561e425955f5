#!/usr/bin/env bash
# buildx, the maintained BuildKit client, as the host docker CLI's plugin. `stackpin build
# --builder buildkit` and the Docker tier's BuildKit tests need it on every engine, the
# default one included, and Debian bookworm packages no docker-buildx: it comes from Debian
# sid, fetched with `apt-get download` through a PRIVATE sources list, list state and cache
# (the system's apt setup is left alone) and unpacked with `dpkg -x` (one static Go binary).
# README command 1 (scripts/setup-host.sh) runs this; so does scripts/setup-engines.sh.
# Safe to run again: nothing is fetched when the pinned version is in place. One line.
set -euo pipefail

say() { printf 'buildx: %s\n' "$*"; }

HOME_DIR=${STACKPIN_ENGINES_HOME:-/opt/stackpin-engines}
PACKAGE=docker-buildx=0.29.1+ds1-4     # the sid version the Docker tier was proved with
ROOT=$HOME_DIR/buildx
BINARY=$ROOT/usr/libexec/docker/cli-plugins/docker-buildx
PLUGIN=/usr/local/libexec/docker/cli-plugins/docker-buildx

[ "$(id -u)" = 0 ] || { say "must run as root (installs into $HOME_DIR and $PLUGIN)"; exit 8; }

fetch() {
    local apt=$HOME_DIR/apt-buildx
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
        "http://deb.debian.org/debian sid main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
                -o Dir::State::Status=/dev/null -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" -qq update >/dev/null
    rm -f "$apt"/debs/*.deb
    (cd "$apt/debs" && apt-get "${opts[@]}" -qq download "$PACKAGE" >/dev/null) || {
        say "sid no longer serves $PACKAGE: update PACKAGE in $0 to what it serves"
        exit 8
    }
    rm -rf "$ROOT.partial"
    dpkg -x "$apt"/debs/docker-buildx_*.deb "$ROOT.partial"
    rm -rf "$ROOT" && mv "$ROOT.partial" "$ROOT"
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
