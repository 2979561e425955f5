#!/bin/bash
# Run the in-image verification at the site: bin/verify.sh [PROFILE...] [-- VERIFY-ARGS...]
# Default: every profile. Reports go next to the bundle: <bundle>.reports/PROFILE/report.json
# and report.xml (STACKPIN_REPORT_DIR overrides <bundle>.reports). Exit 0 = all passed,
# 6 when a profile failed a required check, 8 when its image is not loaded.
# Options: --pubkey FILE, --insecure-unsigned, --allow-host-access (as load.sh / start.sh):
# the signature is checked first, as by load.sh.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

take_common_args "$@"
set -- "${REST[@]+"${REST[@]}"}"
profiles=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    profiles+=("$1")
    shift
done
[ "${1:-}" != "--" ] || shift
need_engine "it runs the verification container"
load_bundle_conf
[ "${#profiles[@]}" -gt 0 ] || profiles=("${BUNDLE_PROFILES[@]}")
reports=${STACKPIN_REPORT_DIR:-$BUNDLE.reports}

status=0
for profile in "${profiles[@]}"; do
    load_profile "$profile"
    # shellcheck disable=SC2119  # no list: the profile's default cards
    visibility_args
    profile_image "$EXIT_HOST"
    out="$reports/$profile"
    mkdir -p "$out"
    engine_user_args
    # Offline like the site; as the calling user so the reports are theirs. torchrun's
    # rendezvous resolves the container's hostname, which an offline container cannot
    # look up: name it and map the name to loopback.
    if engine run --rm --init --name "stackpin_site_verify_$profile" --network none \
        --hostname stackpin-verify --add-host stackpin-verify:127.0.0.1 \
        "${ENGINE_USER_ARGS[@]}" --env HOME=/tmp \
        --volume "$(cd "$out" && pwd -P):/var/lib/stackpin/report" \
        "${PROFILE_RUN_ARGS[@]}" "${VISIBILITY_ARGS[@]+"${VISIBILITY_ARGS[@]}"}" "$PROFILE_IMAGE" \
        python -m stackpin_verify --out-dir /var/lib/stackpin/report "$@"; then
        say PASS "verify: profile $profile passed; report $out/report.json"
    else
        say FAIL "verify: profile $profile failed; report $out/report.json"
        status=$EXIT_VERIFICATION
    fi
done
exit "$status"
