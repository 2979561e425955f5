#!/bin/bash
# Seed a registry from this bundle: bin/push.sh HOST[:PORT][/PREFIX] [options]
# Verifies the whole bundle first (signature, SHA256SUMS, every file, as load.sh), then
# copies each image with skopeo by its digest: the manifest and every blob the registry
# gets are byte for byte the ones the signed manifest names (layers stay uncompressed, so
# no digest changes). Blobs the registry already holds are checked with HEAD and skipped,
# so a push that was cut off resumes where the registry stands. Nodes then pull by digest
# (bin/pull.sh). A delta bundle is pushed only where the registry holds the layers it left
# out (refused otherwise, naming them, before anything is sent).
#   --plain-http      talk HTTP, not HTTPS (a registry on loopback, bin/registry.sh's default)
#   --ca-cert FILE    trust this CA for the registry's certificate (a site's own CA)
#   --authfile FILE   registry credentials (containers-auth.json, as skopeo login writes it)
#   --pubkey FILE, --insecure-unsigned: as load.sh
# Needs skopeo (1.9 or newer), zstd, tar, curl (only for a delta) and free disk beside the
# bundle for the unpacked images (STACKPIN_PUSH_TMP chooses the folder).
# Exit codes: 0 pushed; 1 a check failed; 2 usage; 7 bundle (delta base absent, digest
# mismatch); 8 host environment (tools, disk, the registry refused or is unreachable).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

take_common_args "$@"
set -- "${REST[@]+"${REST[@]}"}"
usage="usage: push.sh HOST[:PORT][/PREFIX] [--plain-http] [--ca-cert FILE] [--authfile FILE] [--pubkey FILE]"
dest="" plain=0 ca="" authfile=""
while [ "$#" -gt 0 ]; do
    case $1 in
        --plain-http) plain=1 ;;
        --ca-cert) [ "$#" -ge 2 ] || die_with "$EXIT_USAGE" "--ca-cert needs a file"; ca=$2; shift ;;
        --authfile) [ "$#" -ge 2 ] || die_with "$EXIT_USAGE" "--authfile needs a file"; authfile=$2; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        -*) die_with "$EXIT_USAGE" "unknown option $1 ($usage)" ;;
        *) [ -z "$dest" ] || die_with "$EXIT_USAGE" "$usage"; dest=$1 ;;
    esac
    shift
done
[ -n "$dest" ] || die_with "$EXIT_USAGE" "$usage"
parse_destination "$dest"
[ -z "$ca" ] || [ -f "$ca" ] || die_with "$EXIT_USAGE" "--ca-cert $ca is not a file"
[ -z "$authfile" ] || [ -f "$authfile" ] || die_with "$EXIT_USAGE" "--authfile $authfile is not a file"
need sha256sum "coreutils checks every file"
need zstd "it decompresses images.tar.zst"
need tar "it unpacks the images' layout for skopeo"
need skopeo "it copies the images into the registry (Debian/Ubuntu/RHEL: install skopeo)"

verify_bundle_files

scheme=https
tls_args=()
curl_args=(--silent --show-error --max-time 30)
if [ "$plain" = 1 ]; then
    scheme=http
    tls_args+=(--dest-tls-verify=false)
fi
work=""
cleanup() { [ -z "$work" ] || rm -rf -- "$work"; }
trap cleanup EXIT
if [ -n "$ca" ]; then
    # skopeo reads a folder of certificates (*.crt are CAs), curl one file.
    work=$(mktemp -d "${STACKPIN_PUSH_TMP:-$BUNDLE.push}.XXXXXX")
    mkdir "$work/certs"
    cp -- "$ca" "$work/certs/ca.crt"
    tls_args+=(--dest-cert-dir "$work/certs")
    curl_args+=(--cacert "$ca")
fi
auth_args=()
[ -z "$authfile" ] || auth_args=(--dest-authfile "$authfile")

# A delta: every layer it left out must be a blob of the image's repository already.
if [ "${#BUNDLE_BASE_CHAINS[@]}" -gt 0 ]; then
    need curl "it asks the registry which layers it holds (HEAD), for a delta bundle"
    absent=""
    for profile in "${BUNDLE_PROFILES[@]}"; do
        read_profile "$profile"
        repo=$(profile_repository)
        for i in "${!BUNDLE_BASE_DIFFS[@]}"; do
            code=$(curl "${curl_args[@]}" --head --output /dev/null --write-out '%{http_code}' \
                "$scheme://$REGISTRY_HOST/v2/${repo#*/}/blobs/${BUNDLE_BASE_DIFFS[$i]}" || true)
            case $code in
                200) ;;
                404) absent+="${BUNDLE_BASE_CHAINS[$i]} (diff ${BUNDLE_BASE_DIFFS[$i]})"$'\n' ;;
                *) die_with "$EXIT_HOST" "registry $REGISTRY_HOST answered '${code:-nothing}' to a HEAD for a blob of ${repo#*/}: check the address, --plain-http, --ca-cert" ;;
            esac
        done
    done
    absent=$(printf '%s' "$absent" | LC_ALL=C sort -u)
    [ -z "$absent" ] || refuse_absent "registry $REGISTRY_HOST" "$absent"
    say PASS "delta: the registry holds the ${#BUNDLE_BASE_CHAINS[@]} layer(s) this bundle left out"
fi

[ -n "$work" ] || work=$(mktemp -d "${STACKPIN_PUSH_TMP:-$BUNDLE.push}.XXXXXX")
free=$(df -Pk "$work" | awk 'NR == 2 { printf "%.0f\n", $4 * 1024 }')
[ "${free:-0}" -gt "$BUNDLE_UNPACKED_BYTES" ] \
    || die_with "$EXIT_HOST" "$(dirname -- "$work") has $((${free:-0} >> 20)) MiB free; the images unpack to $((BUNDLE_UNPACKED_BYTES >> 20)) MiB: set STACKPIN_PUSH_TMP to a roomier folder"
mkdir "$work/layout"
# The verified stream, capped at its signed size, unpacked as the OCI layout it is.
zstd -dc --memory=128MB "$BUNDLE/images.tar.zst" | head -c "$BUNDLE_UNPACKED_BYTES" \
    | tar -x -C "$work/layout" --no-same-owner --no-same-permissions
for profile in "${BUNDLE_PROFILES[@]}"; do
    read_profile "$profile"
    repo=$(profile_repository)
    digest=$(profile_manifest_digest)
    # The index names each tag by the part after ':' (org.opencontainers.image.ref.name).
    if ! skopeo copy --quiet --preserve-digests --retry-times 3 "${tls_args[@]}" \
        "${auth_args[@]+"${auth_args[@]}"}" --digestfile "$work/digest" \
        "oci:$work/layout:${PROFILE_IMAGE_TAG##*:}" "docker://$repo:${PROFILE_IMAGE_TAG##*:}" 2>"$work/skopeo.err"; then
        die_with "$EXIT_HOST" "push of $profile to $repo failed: $(tail -n 1 "$work/skopeo.err" | cut -c1-300); run push.sh again to resume (blobs already there are skipped)"
    fi
    pushed=$(cat "$work/digest")
    [ "$pushed" = "$digest" ] \
        || die_with "$EXIT_BUNDLE" "push of $profile: the registry stored manifest $pushed, not the signed $digest"
    say PASS "pushed $profile: $repo@$digest (the signed manifest digest; tag ${PROFILE_IMAGE_TAG##*:})"
done
say PASS "push: ${#BUNDLE_PROFILES[@]} image(s) in $REGISTRY_HOST; on each node: bin/pull.sh $dest"
