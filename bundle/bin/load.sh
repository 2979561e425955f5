#!/bin/bash
# Verify the whole bundle, then load its images: zstd -dc images.tar.zst | docker load
# (or podman load: STACKPIN_ENGINE). Nothing reaches the engine unless every check passed,
# the signature first. A delta bundle (bundle export --against) loads only where the layers
# it left out are present; otherwise it is refused (exit 7), naming them, before a load.
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
need_engine "it loads the images"

verify_bundle_files
if [ "${#BUNDLE_BASE_CHAINS[@]}" -gt 0 ]; then
    held=$(mktemp)
    trap 'rm -f "$held"' EXIT
    engine_layers | cut -d' ' -f1 >"$held"
    absent=$(absent_base_layers "$held")
    [ -z "$absent" ] || refuse_absent "this $ENGINE engine" "$absent"
    say PASS "delta: the ${#BUNDLE_BASE_CHAINS[@]} layer(s) this bundle left out are present"
fi

# zstd's window is capped (--memory), and no more than the signed size reaches Docker.
zstd -dc --memory=128MB "$BUNDLE/images.tar.zst" | head -c "$BUNDLE_UNPACKED_BYTES" | engine load \
    | while IFS= read -r line; do say INFO "$ENGINE: $line"; done
# Config digests (BUNDLE_IMAGE_IDS) and manifest digests (BUNDLE_IMAGE_MANIFESTS): lib.sh's
# known_image says which of the two this engine's store names the image by.
for i in "${!BUNDLE_IMAGE_IDS[@]}"; do
    image_id=${BUNDLE_IMAGE_IDS[$i]}
    loaded=$(known_image "$image_id" "${BUNDLE_IMAGE_MANIFESTS[$i]:-$image_id}") \
        || die "after $ENGINE load, image $image_id is absent: check '$ENGINE images' and the engine's log"
    say PASS "loaded $loaded"
done
say PASS "load: ${#BUNDLE_IMAGE_IDS[@]} image(s) present; next: bin/verify.sh, bin/start.sh PROFILE (${BUNDLE_PROFILES[*]})"
