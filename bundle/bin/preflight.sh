#!/bin/bash
# Can this host run the bundle? One PASS/FAIL/WARN line per check; exit 8 (host
# environment) on any FAIL, 7 when the bundle itself is refused (signature, checksums).
# Reads only the bundle's bin/bundle.conf (signature, then SHA256SUMS) and the host.
# Options: --pubkey FILE, --insecure-unsigned (as load.sh).
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

take_common_args "$@"
[ "${#REST[@]}" -eq 0 ] || die_with "$EXIT_USAGE" "unknown argument ${REST[0]} (usage: preflight.sh [--pubkey FILE])"

to_bytes() {  # 32g, 16G, 64gb, 1024m, 512k, 1000 -> bytes
    local text=${1,,} number unit
    number=${text%%[!0-9]*}
    unit=${text#"$number"}
    unit=${unit%b}
    case $unit in
        '') printf '%s\n' "$number" ;;
        k) printf '%s\n' $((number << 10)) ;;
        m) printf '%s\n' $((number << 20)) ;;
        g) printf '%s\n' $((number << 30)) ;;
        t) printf '%s\n' $((number << 40)) ;;
        *) printf '0\n' ;;
    esac
}

gib() { awk -v b="$1" 'BEGIN { printf "%.1f GiB", b / 1073741824 }'; }

for tool in sha256sum zstd "$ENGINE"; do
    command -v "$tool" >/dev/null 2>&1 || { say FAIL "$tool: not installed"; FAILED=1; }
done
if openssl_verifies_ed25519; then
    say PASS "openssl: $(openssl version | cut -d' ' -f2) verifies the ed25519 signature"
elif [ "$INSECURE" -eq 0 ]; then
    say FAIL "openssl >= 1.1.1 absent: the scripts cannot check manifest.sig and refuse the bundle; install openssl"
    FAILED=1
fi
[ "$FAILED" -eq 0 ] || exit "$EXIT_HOST"
load_bundle_conf
say PASS "bundle: format ${BUNDLE_FORMAT_VERSION}, profiles ${BUNDLE_PROFILES[*]}, platform ${BUNDLE_PLATFORMS[*]}"

machine=$(uname -m)
for want in "${BUNDLE_CPU_ARCHES[@]}"; do
    if [ "$machine" = "$want" ]; then say PASS "cpu: $machine"; else fail "cpu: this host is $machine, the images are $want"; fi
done

# Both engines answer .Server.Version (Podman: its own version); the oldest tested differ.
oldest=20 && [ "$ENGINE" = podman ] && oldest=4
if server=$(engine version --format '{{.Server.Version}}' 2>/dev/null) && [ -n "$server" ]; then
    major=${server%%.*}
    if [ "${major:-0}" -ge "$oldest" ] 2>/dev/null; then say PASS "$ENGINE: engine $server"
    else say WARN "$ENGINE: engine $server is older than $oldest, the oldest major version tested"; fi
elif [ "$ENGINE" = podman ]; then
    fail "podman: it does not answer (podman info says why), or this user may not use it"
else
    fail "docker: no engine answers (start it: systemctl start docker), or this user may not use it"
fi


# The host checks of each image's platform (its PlatformSpec, rendered into bundle.conf:
# device nodes, driver folders, the container runtime), then the profiles' device nodes.
has_runtime() {  # NAME: the engine lists this runtime, or its container CLI is installed
    engine info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "$1" \
        || command -v "$1-container-cli" >/dev/null 2>&1
}
probe_holds() {  # KIND TARGET: 0 when the host has it, 1 when not, 2 for an unknown kind
    case $1 in
        node) [ -e "$2" ] ;;
        folder) [ -d "$2" ] ;;
        runtime) has_runtime "$2" ;;
        none) true ;;
        *) return 2 ;;
    esac
}
for i in "${!BUNDLE_PROBE_KINDS[@]}"; do
    if [ "${BUNDLE_PROBE_KINDS[$i]}" = runtime ] && [ "$ENGINE" = podman ]; then
        # Podman reaches cards through CDI, not a runtime, and the profiles' --gpus flag is
        # Docker's (Podman 4.3 lacks it): the platform's probe says what that means.
        if ls /etc/cdi/*.yaml /var/run/cdi/*.yaml >/dev/null 2>&1; then
            say WARN "${BUNDLE_PROBE_PODMAN_CDI[$i]}"
        else
            fail "${BUNDLE_PROBE_PODMAN_NO_CDI[$i]}"
        fi
        continue
    fi
    probe_holds "${BUNDLE_PROBE_KINDS[$i]}" "${BUNDLE_PROBE_TARGETS[$i]}"
    case $? in
        0) say PASS "${BUNDLE_PROBE_PASSED[$i]}" ;;
        1) fail "${BUNDLE_PROBE_FAILED[$i]}" ;;
        *) say WARN "probe ${BUNDLE_PROBE_KINDS[$i]}: not a check this script knows" ;;
    esac
done
for path in "${BUNDLE_HOST_PATHS[@]}"; do
    if [ -e "$path" ]; then say PASS "mount: $path present"; else fail "mount: $path is missing"; fi
done

shm_have=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { printf "%.0f\n", $2 * 1024 }')
mem_have=$(awk '/^MemTotal:/ { printf "%.0f\n", $2 * 1024 }' /proc/meminfo 2>/dev/null)
if [ "${#BUNDLE_SHM_SIZES[@]}" -eq 0 ]; then
    say PASS "shm: no shared-memory size requested"
fi
for size in "${BUNDLE_SHM_SIZES[@]}"; do
    want=$(to_bytes "$size")
    if [ -n "$mem_have" ] && [ "$mem_have" -lt "$want" ]; then
        fail "shm: --shm-size $size needs $(gib "$want") but the host has $(gib "$mem_have") of memory"
    elif [ -n "$shm_have" ] && [ "$shm_have" -lt "$want" ]; then
        say WARN "shm: host /dev/shm is $(gib "$shm_have"), containers ask for $size (--ipc=host would need it)"
    else
        say PASS "shm: $size fits (memory $(gib "${mem_have:-0}"))"
    fi
done

# Where the engine unpacks images: Docker's root dir, Podman's graph root.
root_field='{{.DockerRootDir}}' && [ "$ENGINE" = podman ] && root_field='{{.Store.GraphRoot}}'
root_dir=$(engine info --format "$root_field" 2>/dev/null || true)
free=$(df -Pk "${root_dir:-/nonexistent}" 2>/dev/null | awk 'NR == 2 { printf "%.0f\n", $4 * 1024 }')
need_bytes=$BUNDLE_UNPACKED_BYTES
if [ -z "$free" ]; then
    say WARN "disk: cannot read free space of the docker root '${root_dir:-unknown}'; $(gib "$need_bytes") needed"
elif [ "$free" -lt "$need_bytes" ]; then
    fail "disk: $(gib "$free") free in $root_dir, the images unpack to $(gib "$need_bytes")"
elif [ "$free" -lt $((need_bytes * 2)) ]; then
    say WARN "disk: $(gib "$free") free in $root_dir; $ENGINE load stages the archive first, up to $(gib $((need_bytes * 2)))"
else
    say PASS "disk: $(gib "$free") free in $root_dir, images unpack to $(gib "$need_bytes")"
fi

if [ "${#BUNDLE_ARCHES[@]}" -gt 0 ]; then
    seen="" undecided=""
    if command -v rocminfo >/dev/null 2>&1; then
        seen=$(rocminfo 2>/dev/null | grep -oE 'gfx[0-9a-f]+' | sort -u | tr '\n' ' ')
    elif command -v nvidia-smi >/dev/null 2>&1; then
        seen=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
            | sed 's/\.//; s/^/sm_/' | sort -u | tr '\n' ' ')
    elif command -v hy-smi >/dev/null 2>&1; then
        seen=$(hy_smi_isas)
        [ -n "$seen" ] || undecided="hy-smi names no gfx target and no card stackpin knows (K100_AI, BW)"
    fi
    if [ -n "$undecided" ]; then
        say WARN "accelerator: cannot decide: $undecided; run rocminfo to see the ISA; expected ${BUNDLE_ARCHES[*]}"
    elif [ -z "$seen" ]; then
        say WARN "accelerator: no rocminfo, hy-smi or nvidia-smi answer; expected ${BUNDLE_ARCHES[*]}"
    else
        seen=${seen% }
        match=no
        for arch in "${BUNDLE_ARCHES[@]}"; do
            case " $seen " in *" $arch "*) match=yes ;; esac
        done
        if [ "$match" = yes ]; then say PASS "accelerator: $seen (images built for ${BUNDLE_ARCHES[*]})"
        else fail "accelerator: this host has $seen; the images are built for ${BUNDLE_ARCHES[*]}"; fi
    fi
fi

if [ "$FAILED" -ne 0 ]; then
    say FAIL "preflight: fix the FAIL lines above, then run bin/preflight.sh again"
    exit "$EXIT_HOST"
fi
say PASS "preflight: this host can run the bundle; next: bin/load.sh --pubkey stackpin.pub"
