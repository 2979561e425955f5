#!/bin/bash
# Stop a profile: bin/stop.sh PROFILE
# Stops and removes its container, then waits until its processes are gone.
#   STACKPIN_STOP_TIMEOUT seconds for a clean exit before SIGKILL (default 30)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

[ "$#" -eq 1 ] || die "usage: stop.sh PROFILE"
profile=$1
[[ "$profile" =~ ^[a-z0-9][a-z0-9.-]*$ ]] || die "profile '$profile' is not a profile name"
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
    [ "$SECONDS" -lt "$deadline" ] || die "stop: $name or its processes are still there; check 'docker ps -a'"
    sleep 1
done
if command -v hy-smi >/dev/null 2>&1; then
    # Freed device memory can lag process exit: stopped means zero use on the device.
    say INFO "device memory after stop (should return to zero before the next start):"
    hy-smi 2>/dev/null | sed 's/^/    /' || true
fi
say PASS "stop: profile $profile stopped, container $name removed, processes gone"
