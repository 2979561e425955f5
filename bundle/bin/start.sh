#!/bin/bash
# Start a profile: bin/start.sh PROFILE [-- COMMAND...]
# The port is published on 127.0.0.1 only; each profile has its own state directory and
# container; start waits until Docker reports the container healthy.
#   STACKPIN_PORT (default: the profile's port)   STACKPIN_STATE_DIR (default: <bundle>.state/PROFILE)
#   STACKPIN_CONTAINER_PORT (default 8000)        STACKPIN_START_TIMEOUT seconds (default 180)
# The default command serves the state directory with python's http.server from the
# image's environment: a health endpoint for images that have no service of their own.
# Options (before PROFILE): --pubkey FILE, --insecure-unsigned, and --allow-host-access for
# a profile whose signed run flags reach into the host (privileged, host namespaces,
# capabilities, sensitive mounts). The signature is checked first, as by load.sh.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

take_common_args "$@"
set -- "${REST[@]+"${REST[@]}"}"
[ "$#" -ge 1 ] || die "usage: start.sh PROFILE [-- COMMAND...]"
profile=$1
shift
if [ "$#" -gt 0 ]; then
    [ "$1" = "--" ] || die "usage: start.sh PROFILE [-- COMMAND...]"
    shift
fi
need docker "it runs the profile's container"
load_bundle_conf
load_profile "$profile"

port=${STACKPIN_PORT:-$PROFILE_PORT}
inner=${STACKPIN_CONTAINER_PORT:-8000}
timeout=${STACKPIN_START_TIMEOUT:-180}
state=${STACKPIN_STATE_DIR:-$BUNDLE.state/$profile}
name=$(container_name "$profile")
if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    die "port '$port' is not a port number"
fi

docker image inspect "$PROFILE_IMAGE_ID" >/dev/null 2>&1 \
    || die "image $PROFILE_IMAGE_TAG ($PROFILE_IMAGE_ID) is not loaded: run bin/load.sh first"
if status=$(docker container inspect --format '{{.State.Status}}' "$name" 2>/dev/null); then
    if [ "$status" = running ]; then
        die "profile $profile is already running (container $name): bin/stop.sh $profile first"
    fi
    docker rm -f "$name" >/dev/null  # an exited leftover of an earlier start
fi
if (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null || [ -n "$(docker ps -q --filter "publish=$port")" ]; then
    die "port 127.0.0.1:$port is taken: stop what uses it or set STACKPIN_PORT"
fi

if [ "$#" -gt 0 ]; then
    command=("$@")
else
    command=(python -m http.server --bind 0.0.0.0 --directory /var/lib/stackpin/state "$inner")
fi
mkdir -p "$state"
health="python -c 'import urllib.request; urllib.request.urlopen(\"http://127.0.0.1:$inner/\", timeout=5)'"
# --init: PID 1 forwards SIGTERM, so stop.sh's clean stop does not wait out the grace time.
docker run --detach --init --name "$name" --restart no \
    --label io.stackpin.profile="$profile" --label io.stackpin.bundle-image="$PROFILE_IMAGE_ID" \
    --publish "127.0.0.1:$port:$inner" \
    --volume "$state:/var/lib/stackpin/state" \
    --env STACKPIN_PROFILE="$profile" \
    --health-cmd "$health" --health-interval 2s --health-timeout 5s --health-retries 3 \
    --health-start-period "${timeout}s" \
    "${PROFILE_RUN_ARGS[@]}" "$PROFILE_IMAGE_ID" "${command[@]}" >/dev/null

deadline=$((SECONDS + timeout))
while :; do
    health_status=$(docker inspect --format '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$name" 2>/dev/null || echo gone)
    case $health_status in
        "running healthy") break ;;
        "running unhealthy"|exited*|dead*|gone)
            docker logs --tail 20 "$name" 2>&1 | sed 's/^/    /' || true
            docker rm -f "$name" >/dev/null 2>&1 || true
            die "profile $profile did not become healthy ($health_status); its log is above" ;;
    esac
    if [ "$SECONDS" -ge "$deadline" ]; then
        docker logs --tail 20 "$name" 2>&1 | sed 's/^/    /' || true
        docker rm -f "$name" >/dev/null 2>&1 || true
        die "profile $profile not healthy after ${timeout}s; raise STACKPIN_START_TIMEOUT or read the log above"
    fi
    sleep 1
done
say PASS "start: profile $profile healthy at http://127.0.0.1:$port/ (container $name, state $state)"
