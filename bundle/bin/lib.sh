#!/bin/bash
# Shared by the site scripts of a stackpin bundle: checks that need only bash, coreutils,
# sed, find, sha256sum and (for signatures) openssl. Sourced, never run.
# shellcheck disable=SC2034  # variables are used by the scripts that source this file

# Exit codes, stackpin's own (stackpin.errors; README): 0 ok, 2 usage, 3 configuration,
# 6 verification, 7 bundle (refused: damaged, altered, unsigned), 8 host environment.
# tests/unit/test_parity.py holds them, the caps and the trust order below equal to Python's.
EXIT_USAGE=2
EXIT_CONFIGURATION=3
EXIT_VERIFICATION=6
EXIT_BUNDLE=7
EXIT_HOST=8

BUNDLE_BIN=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
BUNDLE=$(dirname -- "$BUNDLE_BIN")
FAILED=0
# Trust: the key comes from the site, never from the bundle. Precedence: --pubkey FILE,
# then $STACKPIN_PUBKEY, then the site trust file. The only way past a missing, malformed
# or foreign signature is the explicit opt-out, and every line then says so.
SITE_TRUST_FILE=/etc/stackpin/trusted.pub
TRUST_PUBKEY=${STACKPIN_PUBKEY:-}
TRUST_ORIGIN=STACKPIN_PUBKEY
INSECURE=0
ALLOW_HOST_ACCESS=0
TRUST_CHECKED=0
# Size caps, checked with stat before a byte is read: manifest.json is parsed by sed and
# openssl reads it whole (ed25519 signs the whole message); SHA256SUMS is read by sed/awk.
MAX_MANIFEST_BYTES=16777216
MAX_SUMS_BYTES=16777216
MAX_KEY_BYTES=65536
SIGNATURE_BYTES=64

say() {  # LEVEL MESSAGE: one line, PASS/FAIL/WARN/INFO first; controls in MESSAGE escaped
    local text=${2//[$'\001'-$'\037'$'\177']/?}
    if [ "$INSECURE" -eq 1 ]; then
        printf '%-4s  %s  [INSECURE: signature not checked]\n' "$1" "$text"
    else
        printf '%-4s  %s\n' "$1" "$text"
    fi
}

fail() {
    say FAIL "$1"
    FAILED=1
}

die() {  # MESSAGE: the bundle is refused (exit 7, as stackpin's BundleError)
    say FAIL "$1" >&2
    exit "$EXIT_BUNDLE"
}

die_with() {  # CODE MESSAGE: one line, the documented exit code (README: site scripts)
    say FAIL "$2" >&2
    exit "$1"
}

# An opt-in variable is 1 or unset (or 0): "false", "no" or a typo never opts in silently.
opt_in() {  # NAME VALUE
    case $2 in
        ''|0) return 1 ;;
        1) return 0 ;;
        *) die "$1='$2': set it to 1 to opt in, or unset it" ;;
    esac
}
if opt_in STACKPIN_INSECURE_UNSIGNED "${STACKPIN_INSECURE_UNSIGNED:-}"; then INSECURE=1; fi
if opt_in STACKPIN_ALLOW_HOST_ACCESS "${STACKPIN_ALLOW_HOST_ACCESS:-}"; then ALLOW_HOST_ACCESS=1; fi

need() {  # COMMAND WHY
    command -v "$1" >/dev/null 2>&1 || die_with "$EXIT_HOST" "$1 is not installed: $2"
}

# The container engine: Docker or Podman (the CLI a site has: RHEL-family sites run Podman).
# STACKPIN_ENGINE=docker|podman chooses; otherwise docker when installed, else podman.
# Every engine call goes through `engine`, and only options and fields both report are used.
case ${STACKPIN_ENGINE:-} in
    docker|podman) ENGINE=$STACKPIN_ENGINE ;;
    '') if command -v docker >/dev/null 2>&1 || ! command -v podman >/dev/null 2>&1; then
            ENGINE=docker
        else
            ENGINE=podman
        fi ;;
    *) say FAIL "STACKPIN_ENGINE='${STACKPIN_ENGINE//[^A-Za-z0-9._-]/?}': set it to docker or podman, or unset it" >&2
       exit "$EXIT_USAGE" ;;
esac

engine() {
    "$ENGINE" "$@"
}

need_engine() {  # WHY
    need "$ENGINE" "$1 (STACKPIN_ENGINE=docker|podman chooses the engine)"
}

# Podman without root keeps the caller's UID inside only when told to (--userns=keep-id);
# otherwise files the container writes to a mounted folder belong to a sub-UID.
ENGINE_USER_ARGS=()
engine_user_args() {  # ENGINE_USER_ARGS := what runs the container as the calling user
    ENGINE_USER_ARGS=(--user "$(id -u):$(id -g)")
    if [ "$ENGINE" = podman ] && [ "$(id -u)" != 0 ]; then
        ENGINE_USER_ARGS+=(--userns=keep-id)
    fi
}

# NAME: "STATUS HEALTH" of a container, as both engines report it. Docker runs the image's
# HEALTHCHECK itself; Podman runs it from systemd timers, which a host without systemd (or
# a rootless session without a user bus) lacks, so the check is run here once per call.
container_health() {
    if [ "$ENGINE" = podman ]; then
        engine healthcheck run "$1" >/dev/null 2>&1 || true
    fi
    engine inspect --format '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$1" 2>/dev/null
}

# The options every script takes; the rest is left in REST (a "--" and what follows too).
REST=()
take_common_args() {
    while [ "$#" -gt 0 ]; do
        case $1 in
            --pubkey) [ "$#" -ge 2 ] || die_with "$EXIT_USAGE" "--pubkey needs a file"
                TRUST_PUBKEY=$2; TRUST_ORIGIN=--pubkey; shift 2 ;;
            --pubkey=*) TRUST_PUBKEY=${1#--pubkey=}; TRUST_ORIGIN=--pubkey; shift ;;
            --insecure-unsigned) INSECURE=1; shift ;;
            --allow-host-access) ALLOW_HOST_ACCESS=1; shift ;;
            --) REST+=("$@"); return 0 ;;
            *) REST+=("$1"); shift ;;
        esac
    done
}

file_size() {  # PATH: the size from the inode, without reading the file
    stat -L -c %s -- "$1"
}

# PATH LIMIT WHAT: a regular file (no link, device or fifo) of at most LIMIT bytes.
small_regular_file() {
    if [ ! -f "$1" ] || [ -L "$1" ]; then
        die "$3 is missing or not a regular file: get a fresh copy of the bundle"
    fi
    local size
    size=$(file_size "$1") || die "$3: cannot read its size"
    [ "$size" -le "$2" ] || die "$3 is $size bytes, larger than $2: not a file stackpin wrote; do not load it"
}

# openssl 1.1.1 or newer (LibreSSL lacks pkeyutl -rawin for ed25519).
openssl_verifies_ed25519() {
    command -v openssl >/dev/null 2>&1 \
        && openssl version 2>/dev/null | grep -qE '^OpenSSL (1\.1\.1|[3-9]\.)'
}

# The trusted key by precedence: --pubkey FILE (take_common_args), then $STACKPIN_PUBKEY
# (read at the top), then the site trust file; stackpin.bundle.trust.resolve, the same order.
choose_trusted_key() {
    if [ -z "$TRUST_PUBKEY" ] && [ -e "$SITE_TRUST_FILE" ]; then
        TRUST_PUBKEY=$SITE_TRUST_FILE
        TRUST_ORIGIN="site trust file"
    fi
}

# The signature over the exact bytes of manifest.json, against the site's key, before any
# field of it is read. Fails closed: no key, no signature, a malformed one, no verifier.
check_trust() {
    [ "$TRUST_CHECKED" -eq 0 ] || return 0
    TRUST_CHECKED=1
    small_regular_file "$BUNDLE/manifest.json" "$MAX_MANIFEST_BYTES" manifest.json
    if [ "$INSECURE" -eq 1 ]; then
        say WARN "signature: NOT CHECKED (--insecure-unsigned / STACKPIN_INSECURE_UNSIGNED): anyone who could touch this bundle could have changed it"
        return 0
    fi
    choose_trusted_key
    [ -n "$TRUST_PUBKEY" ] || die "no trusted key: pass --pubkey stackpin.pub (received from the build host by a separate channel), set STACKPIN_PUBKEY or install $SITE_TRUST_FILE; --insecure-unsigned skips the check"
    small_regular_file "$TRUST_PUBKEY" "$MAX_KEY_BYTES" "public key $TRUST_PUBKEY ($TRUST_ORIGIN)"
    if [ ! -e "$BUNDLE/manifest.sig" ] && [ ! -L "$BUNDLE/manifest.sig" ]; then
        die "manifest.sig is missing: refusing an unsigned bundle; do not load it"
    fi
    small_regular_file "$BUNDLE/manifest.sig" "$SIGNATURE_BYTES" manifest.sig
    [ "$(file_size "$BUNDLE/manifest.sig")" -eq "$SIGNATURE_BYTES" ] \
        || die "manifest.sig is not a $SIGNATURE_BYTES-byte ed25519 signature: damaged or re-signed with another tool; do not load it"
    openssl_verifies_ed25519 \
        || die_with "$EXIT_HOST" "openssl >= 1.1.1 is not installed, so this host cannot check the ed25519 signature: install it (Debian/Ubuntu: openssl) or verify on a trusted host with stackpin bundle verify; nothing was loaded"
    if ! openssl pkeyutl -verify -pubin -inkey "$TRUST_PUBKEY" -rawin \
        -in "$BUNDLE/manifest.json" -sigfile "$BUNDLE/manifest.sig" >/dev/null 2>&1; then
        die "manifest.sig does not match manifest.json for the key from $TRUST_ORIGIN: edited after signing or signed with another key; do not load it"
    fi
    say PASS "signature: manifest.json is signed by the key from $TRUST_ORIGIN ($TRUST_PUBKEY)"
}

# The sha256 of SHA256SUMS as the signed manifest records it, on its own line by
# construction. Read only after check_trust (signature, size cap).
manifest_sums_hash() {
    check_trust
    local found
    found=$(sed -n 's/^  "sha256sums": "\([0-9a-f]\{64\}\)",\{0,1\}$/\1/p' "$BUNDLE/manifest.json" | head -n 2)
    if [ "$(printf '%s\n' "$found" | grep -c .)" -ne 1 ]; then
        die "manifest.json has no single sha256sums line: the bundle is damaged; get a fresh copy"
    fi
    printf '%s\n' "$found"
}

# manifest.json -> SHA256SUMS -> every file; paths in SHA256SUMS must be plain and inside.
check_sums_file() {
    check_trust
    small_regular_file "$BUNDLE/SHA256SUMS" "$MAX_SUMS_BYTES" SHA256SUMS
    local want have
    want=$(manifest_sums_hash)
    have=$(sha256sum < "$BUNDLE/SHA256SUMS" | cut -d' ' -f1)
    [ "$want" = "$have" ] || die "SHA256SUMS does not match manifest.json: the bundle was altered; do not load it"
    if LC_ALL=C grep -vqE '^[0-9a-f]{64}  [A-Za-z0-9_+-][A-Za-z0-9._+-]*(/[A-Za-z0-9_+-][A-Za-z0-9._+-]*)*$' \
        "$BUNDLE/SHA256SUMS"; then
        die "SHA256SUMS lists an unsafe path: the bundle was altered; do not load it"
    fi
}

# No links, devices or files the manifest does not list; nothing listed missing. Unlisted
# files under models/ are the site's own models (the folder start.sh mounts), not extras.
# Streams: no listing is held in a shell variable.
check_listing() {
    local odd extra missing
    odd=$(cd "$BUNDLE" && find . ! -type f ! -type d -print | head -n 1 | tr -c '[:print:]\n' '?')
    [ -z "$odd" ] || die "${odd#./} is a link, device or fifo: a bundle holds regular files only"
    extra=$(LC_ALL=C comm -13 <(sed 's/^[0-9a-f]\{64\}  //' "$BUNDLE/SHA256SUMS" | LC_ALL=C sort) \
        <(present_files) | { grep -v '^models/' || true; } | head -n 1 | tr -c '[:print:]\n' '?')
    missing=$(LC_ALL=C comm -23 <(sed 's/^[0-9a-f]\{64\}  //' "$BUNDLE/SHA256SUMS" | LC_ALL=C sort) \
        <(present_files) | head -n 1)
    [ -z "$extra" ] || die "$extra is not in the manifest (an extra file): remove it or get a fresh copy"
    [ -z "$missing" ] || die "$missing is missing: the bundle is incomplete; get a fresh copy"
}

present_files() {
    (cd "$BUNDLE" && find . -type f ! -path ./manifest.json ! -path ./manifest.sig \
        ! -path ./SHA256SUMS -print | sed 's|^\./||' | LC_ALL=C sort)
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
    BUNDLE_BASE_CHAINS=() BUNDLE_BASE_DIFFS=()  # a full bundle (and older ones) need none
    # shellcheck source=/dev/null
    . "$BUNDLE/bin/bundle.conf"
}

# The whole bundle checked (the signature's trust, SHA256SUMS, its listing, every file),
# then bundle.conf sourced: what load.sh and push.sh do before an engine or a registry is
# touched.
verify_bundle_files() {
    check_trust
    check_sums_file
    check_listing
    check_files
    say PASS "checksums: every file matches SHA256SUMS, no file missing or extra"
    load_bundle_conf
    [[ "$BUNDLE_UNPACKED_BYTES" =~ ^[0-9]{1,16}$ ]] || die "bin/bundle.conf: BUNDLE_UNPACKED_BYTES is not a size"
}

require_profile() {  # PROFILE: a well-formed name of one of this bundle's profiles, or a usage error
    local profile=$1 known=()
    [[ "$profile" =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die_with "$EXIT_USAGE" "profile '$profile' is not a profile name"
    if [ ! -f "$BUNDLE/bin/profiles/$profile.conf" ]; then
        for conf in "$BUNDLE"/bin/profiles/*.conf; do
            [ -f "$conf" ] && known+=("$(basename -- "$conf" .conf)")
        done
        die_with "$EXIT_USAGE" "no profile '$profile' in this bundle; profiles: ${known[*]-none}"
    fi
}

load_profile() {  # PROFILE
    local profile=$1
    require_profile "$profile"
    check_files "bin/profiles/$profile.conf"
    # shellcheck source=/dev/null
    . "$BUNDLE/bin/profiles/$profile.conf"
    check_run_args "$profile" "${PROFILE_RUN_ARGS[@]+"${PROFILE_RUN_ARGS[@]}"}"
}

# A classic store names an image by its config digest, a containerd image store by its
# manifest digest: the bundle carries both, and the one the engine knows is used.
known_image() {  # ID...: print the first ID this engine has an image for; 1 when none
    local candidate
    for candidate in "$@"; do
        if engine image inspect --format '{{.Id}}' "$candidate" >/dev/null 2>&1; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    return 1
}

profile_image() {  # EXIT_CODE: PROFILE_IMAGE := the loaded image as this engine names it
    PROFILE_IMAGE=$(known_image "${PROFILE_IMAGE_IDS[@]}") \
        || die_with "$1" "image $PROFILE_IMAGE_TAG ($PROFILE_IMAGE_ID) is not loaded: run bin/load.sh first"
}

# Host paths a container may not mount without the site's explicit consent: the root,
# system and credential folders, the Docker socket and state.
SENSITIVE_HOST_PATHS=(/ /etc /root /home /boot /proc /sys /dev /run /var /var/run /var/lib
    /var/lib/docker /var/run/docker.sock /run/docker.sock /var/lib/containers /run/podman
    /run/podman/podman.sock /usr /bin /sbin /lib /lib64 /opt /srv
    /tmp /mnt /media)

sensitive_mount() {  # HOST_PATH: 0 when it is, or contains, or lies in a sensitive folder
    local host=$1 path
    case /$host/ in */../*|*/./*) return 0 ;; esac
    [ "${host#/}" != "$host" ] || return 0  # not absolute: a named volume or a trick
    while [[ "$host" == *//* ]]; do host=${host//\/\//\/}; done
    [ "$host" = / ] || host=${host%/}
    for path in "${SENSITIVE_HOST_PATHS[@]}"; do
        [ "$host" != "$path" ] || return 0
    done
    case $host in
        /etc/*|/root/*|/boot/*|/proc/*|/sys/*|/dev/*|/run/*|/var/run/*|/var/lib/docker/*) return 0 ;;
        /var/lib/containers/*) return 0 ;;
        /usr/*|/bin/*|/sbin/*|/lib/*|/lib64/*|/home/*) return 0 ;;
    esac
    return 1
}

# PROFILE ARGS...: the docker run options of a signed profile, each one a kind stackpin
# writes. Options that reach into the host (privileged, host namespaces, capabilities,
# security profiles off, other devices, sensitive mounts) need the site's explicit
# --allow-host-access (or STACKPIN_ALLOW_HOST_ACCESS=1); any other option is refused.
check_run_args() {
    local profile=$1 arg host broad
    shift
    for arg in "$@"; do
        broad=""
        case $arg in
            --device=/dev/kfd|--device=/dev/dri|--device=/dev/mkfd|--device=/dev/dri/*) ;;
            --device=/dev/nvidia*|--device=/dev/infiniband|--device=/dev/infiniband/*) ;;
            --device=*) broad="device ${arg#--device=}" ;;
            --group-add=*) [[ "${arg#*=}" =~ ^[a-z_][a-z0-9_-]*$|^[0-9]+$ ]] || broad=$arg ;;
            --shm-size=*) [[ "${arg#*=}" =~ ^[0-9]+[bkmgBKMG]?$ ]] || die "profile $profile: bad $arg" ;;
            --gpus=*) [[ "${arg#*=}" =~ ^[A-Za-z0-9,=:\"-]+$ ]] || die "profile $profile: bad $arg" ;;
            --ipc=private|--ipc=shareable|--ipc=none) ;;
            --ulimit=*) [[ "${arg#*=}" =~ ^(memlock|stack|nofile)=-?[0-9]+(:-?[0-9]+)?$ ]] \
                || die "profile $profile: bad $arg" ;;
            --volume=*)
                host=${arg#--volume=}
                host=${host%%:*}
                if sensitive_mount "$host"; then broad="mount of host $host"; fi ;;
            --privileged|--ipc=host|--network=host|--net=host|--pid=host|--userns=host|--uts=host|--cgroupns=host) broad=$arg ;;
            --cap-add=*|--security-opt=*|--device-cgroup-rule=*) broad=$arg ;;
            *) die "profile $profile: '$arg' is not a run option stackpin writes: the profile was altered; do not run it" ;;
        esac
        if [ -n "$broad" ]; then
            [ "$ALLOW_HOST_ACCESS" -eq 1 ] \
                || die "profile $profile asks for host access ($broad): run only if you trust it, with --allow-host-access (or STACKPIN_ALLOW_HOST_ACCESS=1)"
            say WARN "profile $profile: host access allowed by the site: $broad"
        fi
    done
}

# [LIST]: VISIBILITY_ARGS := the --env that limits the container to the cards in LIST (the
# profile's default without one), named for its platform (HIP_VISIBLE_DEVICES on DTK/ROCm,
# CUDA_VISIBLE_DEVICES on CUDA); none for "every card". A LIST given on cpu, or one that is
# not card indices (an empty one too), is a usage error (exit 2) before docker runs.
visibility_args() {
    local chosen=$PROFILE_VISIBLE_DEVICES
    VISIBILITY_ARGS=()
    if [ "$#" -gt 0 ]; then
        [ -n "$PROFILE_VISIBILITY_ENV" ] \
            || die_with "$EXIT_USAGE" "--devices $1: profile $PROFILE_NAME runs on $PROFILE_PLATFORM and has no cards to choose; leave --devices out"
        [[ "$1" =~ ^[A-Za-z0-9-]+(,[A-Za-z0-9-]+)*$ ]] \
            || die_with "$EXIT_USAGE" "--devices '$1' is not a card list: give indices such as 0,1"
        chosen=$1
    fi
    if [ -n "$chosen" ] && [ -n "$PROFILE_VISIBILITY_ENV" ]; then
        VISIBILITY_ARGS=(--env "$PROFILE_VISIBILITY_ENV=$chosen")
    fi
}

# A profile run without its device flags (--no-devices, a GPU image on a host with no
# card), as stackpin.runprofile.without_devices drops them: PROFILE_RUN_ARGS loses its
# --device and --gpus options, the device host's mounts (--volume: /opt/hyhal) and memlock, VISIBILITY_ARGS tells the image (STACKPIN_NO_DEVICES=1,
# stackpin.runprofile.NO_DEVICES_ENV), which then starts Studio on unsloth's CPU fallback.
without_device_args() {
    local kept=() arg
    for arg in "${PROFILE_RUN_ARGS[@]+"${PROFILE_RUN_ARGS[@]}"}"; do
        case $arg in
            --device=*|--gpus=*|--volume=*|--ulimit=memlock=*) ;;
            *) kept+=("$arg") ;;
        esac
    done
    PROFILE_RUN_ARGS=("${kept[@]+"${kept[@]}"}")
    VISIBILITY_ARGS=(--env STACKPIN_NO_DEVICES=1)
    [ -z "$PROFILE_VISIBILITY_ENV" ] \
        || say INFO "--no-devices: profile $PROFILE_NAME runs without its $PROFILE_PLATFORM cards; Studio starts on unsloth's CPU fallback"
}

profile_alias() {  # NAME: the seed calls the enhanced profile "full"
    if [ "$1" = full ]; then printf 'enhanced\n'; else printf '%s\n' "$1"; fi
}

port_taken() {  # PORT: something listens on 127.0.0.1:PORT, or a container publishes it
    # Both engines print published ports as HOST_IP:PORT->PORT/PROTO (Podman has no
    # "publish" filter).
    (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null \
        || engine ps --format '{{.Ports}}' 2>/dev/null | grep -qE "(^|[ ,:])$1->"
}

loopback_answers_healthy() {  # PORT PATH: asked from this host, the way a user reaches it
    local reply attempt
    for attempt in 1 2 3; do
        # shellcheck disable=SC2016  # $1 and $2 expand in the child bash, on purpose
        reply=$(timeout 10 bash -c '
            exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
            printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n" "$2" "$1" >&3
            cat <&3' _ "$1" "$2" 2>/dev/null) || reply=""
        # A 200 that is JSON saying healthy; an HTML page or an error body is not.
        if [[ $reply =~ ^HTTP/1\.[01]\ 200 ]] \
            && [[ $reply =~ [Cc]ontent-[Tt]ype:[[:space:]]*application/json ]] \
            && [[ $reply =~ \"status\"[[:space:]]*:[[:space:]]*\"healthy\" ]]; then
            return 0
        fi
        [ "$attempt" = 3 ] || sleep 1
    done
    return 1
}

# KFD_NODE: the device node every process that holds a card keeps open (/dev/kfd on a
# DCU or ROCm card): the profile's PROFILE_RELEASE_NODE, or STACKPIN_KFD (stop.sh sets it).
KFD_NODE=${STACKPIN_KFD:-}

kfd_holders() {  # the PIDs fuser lists on KFD_NODE, one line; empty when none holds it
    # fuser prints the PIDs on stdout (the name and access letters on stderr); exit 1 = none.
    fuser "$KFD_NODE" 2>/dev/null | tr -s ' \t' ' ' | sed 's/^ //; s/ $//' || true
}

# Card names the field reports, and the ISA each one is (dcu-facts.md): hy-smi may name
# the card rather than its gfx target.
card_isa() {  # WORD: the gfx ISA of a card name, or nothing
    case ${1^^} in
        K100_AI|K100-AI|K100AI) printf 'gfx928\n' ;;
        BW) printf 'gfx936\n' ;;
    esac
}

# hy-smi's output format is not known in detail (a rocm_smi_lib fallback warning may come
# first, then each HCU with temperature, power and memory use): only whole words are read,
# gfx targets as they are and the card names card_isa knows. Nothing else is guessed.
hy_smi_isas() {
    local word isa
    for word in $(hy-smi 2>/dev/null | tr -c 'A-Za-z0-9_-' ' '); do
        if [[ "$word" =~ ^gfx[0-9a-f]+$ ]]; then printf '%s\n' "$word"
        elif isa=$(card_isa "$word") && [ -n "$isa" ]; then printf '%s\n' "$isa"
        fi
    done | sort -u | tr '\n' ' '
}

container_name() {  # PROFILE
    printf 'stackpin_site_%s\n' "$1"
}

# --- layers: what a site holds, for delta bundles ------------------------------------------

DIGEST_RE='^sha256:[0-9a-f]{64}$'

chain_of() {  # PARENT_CHAIN DIFF_ID: the OCI image spec's ChainID of a layer on that parent
    [ -n "$1" ] || { printf '%s\n' "$2"; return 0; }
    printf 'sha256:%s\n' "$(printf '%s %s' "$1" "$2" | sha256sum | cut -d' ' -f1)"
}

# "CHAIN_ID DIFF_ID" of every layer of every image the engine holds, sorted, once each.
# A store keys a layer by its chain ID (the layer with everything below it): docker load
# skips a layer's file exactly when that chain exists, so it is what a delta relies on.
engine_layers() {
    local id diff chain
    engine image ls --quiet --no-trunc 2>/dev/null | LC_ALL=C sort -u | while read -r id; do
        chain=""
        while read -r diff; do
            [[ "$diff" =~ $DIGEST_RE ]] || continue
            chain=$(chain_of "$chain" "$diff")
            printf '%s %s\n' "$chain" "$diff"
        done < <(engine image inspect --format '{{range .RootFS.Layers}}{{println .}}{{end}}' "$id" 2>/dev/null)
    done | LC_ALL=C sort -u
}

# A delta bundle (bundle.conf's BUNDLE_BASE_CHAINS) needs the layers it left out. Each
# absent one is printed as "CHAIN (diff DIFF)"; HELD lists "CHAIN ..." lines the site has.
absent_base_layers() {  # HELD_FILE
    local i
    for i in "${!BUNDLE_BASE_CHAINS[@]}"; do
        if ! grep -qxF -- "${BUNDLE_BASE_CHAINS[$i]}" "$1"; then
            printf '%s (diff %s)\n' "${BUNDLE_BASE_CHAINS[$i]}" "${BUNDLE_BASE_DIFFS[$i]}"
        fi
    done
}

refuse_absent() {  # WHERE ABSENT_LIST: one line naming the layers, exit 7, nothing changed
    local count first more=""
    count=$(printf '%s\n' "$2" | grep -c .)
    first=$(printf '%s\n' "$2" | head -n 3 | paste -sd ';' - | sed 's/;/, /g')
    [ "$count" -le 3 ] || more=" and $((count - 3)) more"
    die_with "$EXIT_BUNDLE" "delta bundle: $count base layer(s) absent from $1: $first$more; load (or push) the bundle it was made against first, or use a full bundle; nothing was changed"
}

# --- registries: bin/push.sh seeds one, bin/pull.sh pulls from it on a node ------------------

# DEST: HOST[:PORT][/PREFIX], PREFIX a repository path (distribution's grammar). Sets
# REGISTRY_HOST and REGISTRY_PREFIX ("" or "a/b/"), or exits 2.
parse_destination() {
    local dest=$1 component
    [[ "$dest" =~ ^([A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9a-fA-F:]+\](:[0-9]{1,5})?)(/.*)?$ ]] \
        || die_with "$EXIT_USAGE" "registry '$dest' is not HOST[:PORT][/PREFIX] (e.g. 127.0.0.1:5000/site)"
    REGISTRY_HOST=${BASH_REMATCH[1]}
    REGISTRY_PREFIX=${dest#"$REGISTRY_HOST"}
    REGISTRY_PREFIX=${REGISTRY_PREFIX#/}
    if [ -n "$REGISTRY_PREFIX" ]; then
        local IFS=/
        for component in $REGISTRY_PREFIX; do
            [[ "$component" =~ ^[a-z0-9]+([._-][a-z0-9]+)*$ ]] \
                || die_with "$EXIT_USAGE" "registry path prefix '$REGISTRY_PREFIX': '$component' is not a repository path component (lower-case letters, digits, . _ -)"
        done
        REGISTRY_PREFIX=$REGISTRY_PREFIX/
    fi
}

# PROFILE: the profile's data (checked against SHA256SUMS) without its run flags' check:
# pushing and pulling run no container.
read_profile() {
    require_profile "$1"
    check_files "bin/profiles/$1.conf"
    # shellcheck source=/dev/null
    . "$BUNDLE/bin/profiles/$1.conf"
}

# The registry repository of the profile's image (its tag's repository under the prefix)
# and the digest the signed manifest names for it (the OCI manifest's).
profile_repository() {
    printf '%s/%s%s\n' "$REGISTRY_HOST" "$REGISTRY_PREFIX" "${PROFILE_IMAGE_TAG%:*}"
}

profile_manifest_digest() {
    local digest=${PROFILE_IMAGE_IDS[1]:-}
    [[ "$digest" =~ $DIGEST_RE ]] \
        || die_with "$EXIT_BUNDLE" "profile $PROFILE_NAME names no manifest digest: export the bundle again with this stackpin"
    printf '%s\n' "$digest"
}
