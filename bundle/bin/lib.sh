#!/bin/bash
# Shared by the site scripts of a stackpin bundle: checks that need only bash, coreutils,
# sed, find, sha256sum and (for signatures) openssl. Sourced, never run.
# shellcheck disable=SC2034  # variables are used by the scripts that source this file

BUNDLE_BIN=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
BUNDLE=$(dirname -- "$BUNDLE_BIN")
FAILED=0

say() {  # LEVEL MESSAGE: one line, PASS/FAIL/WARN/INFO first
    printf '%-4s  %s\n' "$1" "$2"
}

fail() {
    say FAIL "$1"
    FAILED=1
}

die() {
    say FAIL "$1" >&2
    exit 1
}

need() {  # COMMAND WHY
    command -v "$1" >/dev/null 2>&1 || die "$1 is not installed: $2"
}

# The sha256 of SHA256SUMS as the manifest records it, on its own line by construction.
manifest_sums_hash() {
    local found
    found=$(sed -n 's/^  "sha256sums": "\([0-9a-f]\{64\}\)",\{0,1\}$/\1/p' "$BUNDLE/manifest.json")
    if [ "$(printf '%s\n' "$found" | grep -c .)" -ne 1 ]; then
        die "manifest.json has no single sha256sums line: the bundle is damaged; get a fresh copy"
    fi
    printf '%s\n' "$found"
}

# manifest.json -> SHA256SUMS -> every file; paths in SHA256SUMS must be plain and inside.
check_sums_file() {
    if [ ! -f "$BUNDLE/manifest.json" ] || [ -L "$BUNDLE/manifest.json" ]; then
        die "manifest.json is missing: this is not a complete stackpin bundle"
    fi
    if [ ! -f "$BUNDLE/SHA256SUMS" ] || [ -L "$BUNDLE/SHA256SUMS" ]; then
        die "SHA256SUMS is missing: the bundle is incomplete; get a fresh copy"
    fi
    local want have
    want=$(manifest_sums_hash)
    have=$(sha256sum < "$BUNDLE/SHA256SUMS" | cut -d' ' -f1)
    [ "$want" = "$have" ] || die "SHA256SUMS does not match manifest.json: the bundle was altered; do not load it"
    if grep -vqE '^[0-9a-f]{64}  [A-Za-z0-9_+-][A-Za-z0-9._+-]*(/[A-Za-z0-9_+-][A-Za-z0-9._+-]*)*$' \
        "$BUNDLE/SHA256SUMS"; then
        die "SHA256SUMS lists an unsafe path: the bundle was altered; do not load it"
    fi
}

# No links, devices or files the manifest does not list; nothing listed missing. Unlisted
# files under models/ are the site's own models (the folder start.sh mounts), not extras.
check_listing() {
    local odd listed present extra missing
    odd=$(cd "$BUNDLE" && find . ! -type f ! -type d -print | head -n 1)
    [ -z "$odd" ] || die "${odd#./} is a link, device or fifo: a bundle holds regular files only"
    listed=$(sed 's/^[0-9a-f]\{64\}  //' "$BUNDLE/SHA256SUMS" | LC_ALL=C sort)
    present=$(cd "$BUNDLE" && find . -type f ! -path ./manifest.json ! -path ./manifest.sig \
        ! -path ./SHA256SUMS -print | sed 's|^\./||' | LC_ALL=C sort)
    extra=$(LC_ALL=C comm -13 <(printf '%s\n' "$listed") <(printf '%s\n' "$present") \
        | { grep -v '^models/' || true; } | head -n 1)
    missing=$(LC_ALL=C comm -23 <(printf '%s\n' "$listed") <(printf '%s\n' "$present") | head -n 1)
    [ -z "$extra" ] || die "$extra is not in the manifest (an extra file): remove it or get a fresh copy"
    [ -z "$missing" ] || die "$missing is missing: the bundle is incomplete; get a fresh copy"
}

# PUBKEY (may be empty): refuse a missing or bad signature when a key is given.
check_signature() {
    local pubkey=$1
    if [ -z "$pubkey" ]; then
        if [ -f "$BUNDLE/manifest.sig" ]; then
            say WARN "manifest.sig not checked: pass --pubkey stackpin.pub (from the build host, by a separate channel)"
        else
            say WARN "the bundle is not signed: only its checksums are checked"
        fi
        return 0
    fi
    [ -f "$pubkey" ] || die "public key $pubkey does not exist"
    if [ ! -f "$BUNDLE/manifest.sig" ] || [ -L "$BUNDLE/manifest.sig" ]; then
        die "manifest.sig is missing but a public key was given: refusing an unsigned bundle"
    fi
    need openssl "OpenSSL >= 1.1.1 verifies the ed25519 signature (or verify with stackpin on a trusted host)"
    if ! openssl pkeyutl -verify -pubin -inkey "$pubkey" -rawin \
        -in "$BUNDLE/manifest.json" -sigfile "$BUNDLE/manifest.sig" >/dev/null 2>&1; then
        die "manifest.sig does not match manifest.json for $pubkey: edited after signing or signed with another key; do not load it"
    fi
    say PASS "signature: manifest.json is signed by $pubkey"
}

# Every file against SHA256SUMS (all of them, or only the PATHS given).
check_files() {
    local out
    if [ "$#" -eq 0 ]; then
        out=$(cd "$BUNDLE" && sha256sum -c --strict --quiet SHA256SUMS 2>&1) \
            || die "checksum: ${out%%$'\n'*}: the file was altered or damaged; get a fresh copy"
        return 0
    fi
    local path line
    for path in "$@"; do
        line=$(awk -v p="$path" 'substr($0, 67) == p' "$BUNDLE/SHA256SUMS")
        [ -n "$line" ] || die "$path is not listed in SHA256SUMS: the bundle was altered"
        out=$(cd "$BUNDLE" && printf '%s\n' "$line" | sha256sum -c --strict --quiet - 2>&1) \
            || die "checksum: ${out%%$'\n'*}: the file was altered; get a fresh copy"
    done
}

# Sourced data files, each checked against the checked SHA256SUMS first.
load_bundle_conf() {
    check_sums_file
    check_files bin/bundle.conf
    # shellcheck source=/dev/null
    . "$BUNDLE/bin/bundle.conf"
}

load_profile() {  # PROFILE
    local profile=$1
    [[ "$profile" =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die "profile '$profile' is not a profile name"
    if [ ! -f "$BUNDLE/bin/profiles/$profile.conf" ]; then
        die "no profile '$profile' in this bundle; profiles: ${BUNDLE_PROFILES[*]}"
    fi
    check_files "bin/profiles/$profile.conf"
    # shellcheck source=/dev/null
    . "$BUNDLE/bin/profiles/$profile.conf"
}

container_name() {  # PROFILE
    printf 'stackpin_site_%s\n' "$1"
}
