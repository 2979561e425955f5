#!/bin/bash
# Verify the whole bundle, then load its images: zstd -dc images.tar.zst | docker load.
# Nothing reaches Docker unless every check passed.
#   bin/load.sh [--pubkey stackpin.pub]     (or STACKPIN_PUBKEY=stackpin.pub bin/load.sh)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

pubkey=${STACKPIN_PUBKEY:-}
while [ "$#" -gt 0 ]; do
    case $1 in
        --pubkey) [ "$#" -ge 2 ] || die "--pubkey needs a file"; pubkey=$2; shift 2 ;;
        --pubkey=*) pubkey=${1#--pubkey=}; shift ;;
        -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
        *) die "unknown argument $1 (usage: load.sh [--pubkey FILE])" ;;
    esac
done

need sha256sum "coreutils checks every file"
need zstd "it decompresses images.tar.zst"
need docker "it loads the images"

check_sums_file
check_signature "$pubkey"
check_listing
check_files
say PASS "checksums: every file matches SHA256SUMS, no file missing or extra"
load_bundle_conf

zstd -dc "$BUNDLE/images.tar.zst" | docker load
for image_id in "${BUNDLE_IMAGE_IDS[@]}"; do
    docker image inspect --format '{{.Id}}' "$image_id" >/dev/null 2>&1 \
        || die "after docker load, image $image_id is absent: check 'docker images' and the daemon's log"
    say PASS "loaded $image_id"
done
say PASS "load: ${#BUNDLE_IMAGE_IDS[@]} image(s) present; next: bin/verify.sh, bin/start.sh PROFILE (${BUNDLE_PROFILES[*]})"
