#!/bin/bash
# Start a profile's service: bin/start.sh PROFILE [--devices LIST|--no-devices] [--keep] [--force] [-- COMMAND...]
#   PROFILE   stable, enhanced (full is the seed's name for enhanced), or another profile
#   --devices the cards it may use, e.g. 0,1 (HIP_VISIBLE_DEVICES on DTK/ROCm,
#             CUDA_VISIBLE_DEVICES on CUDA; default: the cell's [run] visible_devices)
#   --no-devices  run a GPU profile on a host with no card: its device flags (--device,
#             --gpus, the card choice) are left out and Studio starts on unsloth's CPU
#             fallback (STACKPIN_NO_DEVICES=1 tells the image; slow, for trying it out)
#   --keep    leave the container when it does not become healthy (to debug it)
#   --force   start although another profile runs on this card (never train on both)
# The service's port is published on 127.0.0.1 only. The profile's state folder (accounts,
# chats, training runs) and the bundle's models/ folder (read-only) are mounted as the
# image's service declares; start waits until the health path answers {"status":"healthy"}.
#   STACKPIN_PORT (default: the profile's port)   STACKPIN_STATE_DIR (default <bundle>.state/PROFILE)
#   STACKPIN_MODELS_DIR (default <bundle>/models) STACKPIN_START_TIMEOUT seconds (default: the image's)
# Exit codes: 0 healthy; 2 usage or unknown profile; 3 missing models folder or a profile
# without a service; 6 the service exited or was not healthy in time; 8 host environment
# (no docker or podman, image not loaded, port taken, profile already running, card in use).
# Options (before PROFILE): --pubkey FILE, --insecure-unsigned, and --allow-host-access for
# a profile whose signed run flags reach into the host (privileged, host namespaces,
# capabilities, sensitive mounts). The signature is checked first, as by load.sh.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

take_common_args "$@"
set -- "${REST[@]+"${REST[@]}"}"
usage="usage: start.sh stable|enhanced|full|PROFILE [--devices LIST|--no-devices] [--keep] [--force] [-- COMMAND...]"
profile="" keep=0 force=0 no_devices=0 devices=() command=()
while [ "$#" -gt 0 ]; do
    case $1 in
        --devices) [ "$#" -ge 2 ] || die_with "$EXIT_USAGE" "--devices needs a card list such as 0,1"
            devices=("$2"); shift ;;
        --devices=*) devices=("${1#--devices=}") ;;
        --no-devices) no_devices=1 ;;
        --keep) keep=1 ;;
        --force) force=1 ;;
        --) shift; command=("$@"); break ;;
        -*) die_with "$EXIT_USAGE" "unknown option $1 ($usage)" ;;
        *) [ -z "$profile" ] || die_with "$EXIT_USAGE" "$usage"; profile=$1 ;;
    esac
    shift
done
[ -n "$profile" ] || die_with "$EXIT_USAGE" "$usage"
profile=$(profile_alias "$profile")
need_engine "it runs the profile's container"
load_bundle_conf
load_profile "$profile"
visibility_args "${devices[@]+"${devices[@]}"}"
if [ "$no_devices" = 1 ]; then
    [ "${#devices[@]}" = 0 ] || die_with "$EXIT_USAGE" "--devices and --no-devices contradict each other: give one"
    without_device_args
fi
[ -n "${PROFILE_SERVICE_ARGV+x}" ] \
    || die_with "$EXIT_CONFIGURATION" "profile $profile's image declares no service: add [service] to its cell, or pass -- COMMAND"

port=${STACKPIN_PORT:-$PROFILE_PORT}
timeout=${STACKPIN_START_TIMEOUT:-$PROFILE_READY_TIMEOUT}
state=${STACKPIN_STATE_DIR:-$BUNDLE.state/$profile}
models=${STACKPIN_MODELS_DIR:-$BUNDLE/models}
name=$(container_name "$profile")
if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    die_with "$EXIT_USAGE" "port '$port' is not a port number"
fi
[[ "$timeout" =~ ^[0-9]+$ ]] || die_with "$EXIT_USAGE" "STACKPIN_START_TIMEOUT '$timeout' is not a number of seconds"
[ -d "$models" ] \
    || die_with "$EXIT_CONFIGURATION" "models folder $models is missing: create it and put model folders (safetensors or GGUF) in it, or set STACKPIN_MODELS_DIR"

profile_image "$EXIT_HOST"
if status=$(engine container inspect --format '{{.State.Status}}' "$name" 2>/dev/null); then
    [ "$status" != running ] \
        || die_with "$EXIT_HOST" "profile $profile is already running (container $name): bin/stop.sh $profile first"
    engine rm -f "$name" >/dev/null  # an exited leftover of an earlier start
fi
if [ "$PROFILE_ONE_PER_CARD" = 1 ] && [ "$no_devices" = 0 ] && [ "$force" = 0 ]; then
    other=$(engine ps --filter label=io.stackpin.profile --format '{{.Label "io.stackpin.profile"}}' \
        | grep -vx -- "$profile" | head -n 1 || true)
    [ -z "$other" ] \
        || die_with "$EXIT_HOST" "profile $other is running on this card: never train on two profiles at once; bin/stop.sh $other first, or pass --force"
fi
if port_taken "$port"; then
    die_with "$EXIT_HOST" "port 127.0.0.1:$port is taken: stop what uses it or set STACKPIN_PORT"
fi

[ "${#command[@]}" -gt 0 ] || command=("${PROFILE_SERVICE_ARGV[@]}")
mkdir -p "$state/home"
engine_user_args
# As the calling user, so the state folder stays theirs; --init forwards SIGTERM so
# stop.sh's clean stop does not wait out the grace time.
engine run --detach --init --name "$name" --restart no \
    --label io.stackpin.profile="$profile" --label io.stackpin.bundle-image="$PROFILE_IMAGE_ID" \
    "${ENGINE_USER_ARGS[@]}" --workdir "$PROFILE_STATE_DIR" \
    --publish "127.0.0.1:$port:$PROFILE_CONTAINER_PORT" \
    --volume "$(cd "$state" && pwd -P):$PROFILE_STATE_DIR" \
    --volume "$(cd "$models" && pwd -P):$PROFILE_MODELS_DIR:ro" \
    --env STACKPIN_PROFILE="$profile" --env HOME="$PROFILE_STATE_DIR/home" \
    "${PROFILE_RUN_ARGS[@]}" "${VISIBILITY_ARGS[@]+"${VISIBILITY_ARGS[@]}"}" \
    "$PROFILE_IMAGE" "${command[@]}" >/dev/null \
    || die_with "$EXIT_HOST" "$ENGINE could not start profile $profile; its message is above"

give_up() {  # CODE MESSAGE: show the service's last words, remove it unless --keep
    engine logs --tail 30 "$name" 2>&1 | sed 's/^/    /' >&2 || true
    if [ "$keep" = 0 ]; then
        engine rm -f "$name" >/dev/null 2>&1 || true
    fi
    die_with "$1" "$2"
}
deadline=$((SECONDS + timeout))
while :; do
    health=$(container_health "$name" || echo gone)
    case $health in
        "running healthy") break ;;
        exited*|dead*|gone) give_up "$EXIT_VERIFICATION" "profile $profile exited while starting ($health); its last log lines are above" ;;
    esac
    [ "$SECONDS" -lt "$deadline" ] \
        || give_up "$EXIT_VERIFICATION" "profile $profile not healthy after ${timeout}s ($health); raise STACKPIN_START_TIMEOUT or read the log above"
    sleep 1
done
# The container's HEALTHCHECK asks from inside; a user asks through the published port.
loopback_answers_healthy "$port" "$PROFILE_HEALTH_PATH" \
    || give_up "$EXIT_VERIFICATION" "profile $profile is healthy inside its container, but http://127.0.0.1:$port$PROFILE_HEALTH_PATH does not answer healthy JSON on this host; its last log lines are above"
say PASS "start: profile $profile serves http://127.0.0.1:$port/ (container $name, state $state)"
password=$state/${PROFILE_BOOTSTRAP_PASSWORD#"$PROFILE_STATE_DIR"/}
if [ -f "$password" ]; then
    say INFO "first login: user unsloth, password in $password (change it at once: until then Studio shuts itself down after an hour)"
fi
