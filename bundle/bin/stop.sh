#!/bin/bash
# Stop a profile: bin/stop.sh stable|enhanced|full|PROFILE
# Stops its container gracefully (SIGTERM), removes it, waits until its processes are gone
# and, on DCU hosts, until hy-smi lists no process on the card (freed device memory lags
# process exit there). Exit codes: 0 stopped or not running; 2 usage or no such profile; 8 still present.
#   STACKPIN_STOP_TIMEOUT seconds for a clean exit before SIGKILL (default 30)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

[ "$#" -eq 1 ] || die_with 2 "usage: stop.sh stable|enhanced|full|PROFILE"
profile=$(profile_alias "$1")
require_profile "$profile"  # a typo is an error, not "not running"
need docker "it stops the profile's container"
name=$(container_name "$profile")
grace=${STACKPIN_STOP_TIMEOUT:-30}

if ! info=$(docker container inspect --format '{{.Id}} {{.State.Pid}}' "$name" 2>/dev/null); then
    say PASS "stop: profile $profile is not running"
    exit 0
fi
cid=${info%% *}
pid=${info##* }
# The main process is ours to watch only when this host sees the daemon's PID namespace.
watch_pid=""
if [ "$pid" -gt 0 ] 2>/dev/null && grep -qs "$cid" "/proc/$pid/cgroup"; then
    watch_pid=$pid
fi
docker stop --time "$grace" "$name" >/dev/null
docker rm --force --volumes "$name" >/dev/null
deadline=$((SECONDS + grace + 30))
while docker container inspect "$name" >/dev/null 2>&1 \
    || { [ -n "$watch_pid" ] && grep -qs "$cid" "/proc/$watch_pid/cgroup"; }; do
    [ "$SECONDS" -lt "$deadline" ] || die_with 8 "stop: $name or its processes are still there; check 'docker ps -a'"
    sleep 1
done
if command -v hy-smi >/dev/null 2>&1; then
    # "Stopped" on a DCU means the card shows no process any more, not that ours exited.
    until card_free; do
        [ "$SECONDS" -lt "$deadline" ] \
            || die_with 8 "stop: hy-smi still lists processes on the card $((grace + 30))s after the stop; check 'hy-smi --showpids'"
        sleep 1
    done
    say PASS "stop: hy-smi lists no process on the card"
fi
say PASS "stop: profile $profile stopped, container $name removed, processes gone"
