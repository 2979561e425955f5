#!/bin/bash
# Verify the whole bundle, then load its images: zstd -dc images.tar.zst | docker load.
# Nothing reaches Docker unless every check passed, the signature first.
#   bin/load.sh [--pubkey stackpin.pub] [--insecure-unsigned]
# The key: --pubkey, else $STACKPIN_PUBKEY, else /etc/stackpin/trusted.pub; without one
# (or with an unsigned or foreign-signed bundle) load refuses. STACKPIN_INSECURE_UNSIGNED=1
# is the same opt-out as --insecure-unsigned.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

take_common_args "$@"
for arg in "${REST[@]+"${REST[@]}"}"; do
    case $arg in
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) die_with "$EXIT_USAGE" "unknown argument $arg (usage: load.sh [--pubkey FILE] [--insecure-unsigned])" ;;
    esac
done

need sha256sum "coreutils checks every file"
need zstd "it decompresses images.tar.zst"
need docker "it loads the images"

check_trust
check_sums_file
check_listing
check_files
say PASS "checksums: every file matches SHA256SUMS, no file missing or extra"
load_bundle_conf
[[ "$BUNDLE_UNPACKED_BYTES" =~ ^[0-9]{1,16}$ ]] || die "bin/bundle.conf: BUNDLE_UNPACKED_BYTES is not a size"

# zstd's window is capped (--memory), and no more than the signed size reaches Docker.
zstd -dc --memory=128MB "$BUNDLE/images.tar.zst" | head -c "$BUNDLE_UNPACKED_BYTES" | docker load \
    | while IFS= read -r line; do say INFO "docker: $line"; done
# Config digests (BUNDLE_IMAGE_IDS) and manifest digests (BUNDLE_IMAGE_MANIFESTS): lib.sh's
# known_image says which of the two this engine's store names the image by.
for i in "${!BUNDLE_IMAGE_IDS[@]}"; do
    image_id=${BUNDLE_IMAGE_IDS[$i]}
    loaded=$(known_image "$image_id" "${BUNDLE_IMAGE_MANIFESTS[$i]:-$image_id}") \
        || die "after docker load, image $image_id is absent: check 'docker images' and the daemon's log"
    say PASS "loaded $loaded"
done
say PASS "load: ${#BUNDLE_IMAGE_IDS[@]} image(s) present; next: bin/verify.sh, bin/start.sh PROFILE (${BUNDLE_PROFILES[*]})"
