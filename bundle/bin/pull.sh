#!/bin/bash
# On a node: pull this bundle's images from the site registry by their signed digests.
#   bin/pull.sh HOST[:PORT][/PREFIX] [--plain-http] [--pubkey FILE]
# The node needs the bundle's small files only (manifest.json, manifest.sig, SHA256SUMS,
# bin/): the signature is checked first, then each image is pulled as
# REGISTRY/REPO@<the manifest digest the signed manifest names>, which the engine verifies
# against every byte it receives (manifest, config, layers), and the result is checked:
# the engine names the pulled image by the signed config digest (or, on a containerd
# store, the signed manifest digest) and lists the signed manifest digest. Then it is
# tagged as in the bundle. --plain-http: Podman's --tls-verify=false (Docker talks HTTP to
# 127.0.0.0/8 and to its insecure-registries by itself).
# Exit codes: 0 pulled and checked; 2 usage; 7 a digest differs; 8 the pull failed.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

take_common_args "$@"
set -- "${REST[@]+"${REST[@]}"}"
usage="usage: pull.sh HOST[:PORT][/PREFIX] [--plain-http] [--pubkey FILE]"
dest="" plain=0
while [ "$#" -gt 0 ]; do
    case $1 in
        --plain-http) plain=1 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        -*) die_with "$EXIT_USAGE" "unknown option $1 ($usage)" ;;
        *) [ -z "$dest" ] || die_with "$EXIT_USAGE" "$usage"; dest=$1 ;;
    esac
    shift
done
[ -n "$dest" ] || die_with "$EXIT_USAGE" "$usage"
parse_destination "$dest"
need_engine "it pulls the images"
load_bundle_conf  # signature, then SHA256SUMS, then bundle.conf's own checksum
pull_args=()
[ "$ENGINE" != podman ] || [ "$plain" = 0 ] || pull_args=(--tls-verify=false)

for profile in "${BUNDLE_PROFILES[@]}"; do
    read_profile "$profile"
    repo=$(profile_repository)
    digest=$(profile_manifest_digest)
    if ! out=$(engine pull "${pull_args[@]+"${pull_args[@]}"}" "$repo@$digest" 2>&1); then
        die_with "$EXIT_HOST" "pull of $repo@$digest failed: $(printf '%s' "$out" | tail -n 1 | cut -c1-300)"
    fi
    loaded=$(known_image "${PROFILE_IMAGE_IDS[@]}") \
        || die_with "$EXIT_BUNDLE" "pulled $repo@$digest, but the engine holds no image named by the signed config digest ${PROFILE_IMAGE_IDS[0]}: do not run it"
    engine image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$loaded" \
        | grep -qxF -- "$repo@$digest" \
        || die_with "$EXIT_BUNDLE" "image $loaded does not list the signed manifest digest $repo@$digest: do not run it"
    engine tag "$loaded" "$PROFILE_IMAGE_TAG"
    say PASS "pulled $profile: $repo@$digest is image $loaded (signed config and manifest digests), tagged $PROFILE_IMAGE_TAG"
done
say PASS "pull: ${#BUNDLE_PROFILES[@]} image(s) checked; next: bin/start.sh PROFILE (${BUNDLE_PROFILES[*]})"
