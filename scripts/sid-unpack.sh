# shellcheck shell=bash
# Sourced by setup-engines.sh and setup-buildx.sh: Debian sid packages unpacked into a
# folder of their own, never installed. apt-get runs with a PRIVATE sources list, list
# state and cache, so the system's apt setup is left alone.
#
# sid_unpack APT_DIR ROOT PACKAGE=VERSION...: fetch exactly those versions and unpack them
# into ROOT (built beside it, then swapped in). Returns 1 when sid serves none of them so.
sid_unpack() {
    local apt=$1 root=$2
    shift 2
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
        "http://deb.debian.org/debian sid main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
                -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
                -o Dir::State::Status=/dev/null -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" -qq update >/dev/null
    rm -f "$apt"/debs/*.deb  # an older pin's files must not be unpacked with the new ones
    (cd "$apt/debs" && apt-get "${opts[@]}" -qq download "$@" >/dev/null) || return 1
    rm -rf "$root.partial"
    local deb
    for deb in "$apt"/debs/*.deb; do dpkg -x "$deb" "$root.partial"; done
    rm -rf "$root" && mv "$root.partial" "$root"
}
