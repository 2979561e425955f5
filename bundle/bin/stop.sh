#!/bin/bash
# Stop a profile: bin/stop.sh stable|enhanced|full|PROFILE
# Stops its container gracefully (SIGTERM), removes it and waits until its processes are
# gone. On a profile whose platform holds cards by a node (PROFILE_RELEASE_NODE: /dev/kfd
# on DCU and ROCm) it then waits until `fuser` lists no process on it (the field's rule:
# every process that still holds a card; freed device memory lags process exit). Whether each card's memory use is back at zero, the other half of the field's
# rule, it cannot decide: hy-smi's output format is not known here, so it says so and names
# the check to make. Exit codes: 0 stopped or not running; 2 usage or no such profile;
# 8 still present (container, processes, or a process holding /dev/kfd).
#   STACKPIN_STOP_TIMEOUT seconds for a clean exit before SIGKILL (default 30)
#   STACKPIN_KFD the card's KFD node (default: the profile's release node)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

[ "$#" -eq 1 ] || die_with "$EXIT_USAGE" "usage: stop.sh stable|enhanced|full|PROFILE"
profile=$(profile_alias "$1")
require_profile "$profile"  # a typo is an error, not "not running"
need_engine "it stops the profile's container"
name=$(container_name "$profile")
grace=${STACKPIN_STOP_TIMEOUT:-30}

if ! info=$(engine container inspect --format '{{.Id}} {{.State.Pid}}' "$name" 2>/dev/null); then
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
# The field's rule for a card: no process holds /dev/kfd (fuser, as root: it sees every
# user's processes), then memory use back at zero, which only hy-smi shows.
card_released() {
    if [ ! -e "$KFD_NODE" ]; then
        say INFO "stop: no $KFD_NODE on this host: no card to release"
        return 0
    fi
    if command -v fuser >/dev/null 2>&1; then
        local holders
        until holders=$(kfd_holders) && [ -z "$holders" ]; do
            [ "$SECONDS" -lt "$deadline" ] \
                || die_with "$EXIT_HOST" "stop: processes still hold $KFD_NODE $((grace + 30))s after the stop: PIDs $holders; another profile or a leftover worker uses the card: stop it (by process tree, not pkill -f)"
            sleep 1
        done
        say PASS "stop: no process holds $KFD_NODE (fuser)"
    else
        say WARN "stop: cannot decide whether a process still holds $KFD_NODE: fuser is not installed (Debian/Ubuntu: psmisc)"
    fi
    say WARN "stop: cannot decide whether each card's memory use is back at zero: stackpin does not know hy-smi's output format; check it in hy-smi before the next start"
}

engine stop --time "$grace" "$name" >/dev/null
engine rm --force --volumes "$name" >/dev/null
deadline=$((SECONDS + grace + 30))
while engine container inspect "$name" >/dev/null 2>&1 \
    || { [ -n "$watch_pid" ] && grep -qs "$cid" "/proc/$watch_pid/cgroup"; }; do
    [ "$SECONDS" -lt "$deadline" ] || die_with "$EXIT_HOST" "stop: $name or its processes are still there; check '$ENGINE ps -a'"
    sleep 1
done
# The profile's platform names the node a card is held by (PROFILE_RELEASE_NODE; none
# on a platform without cards). Read, not sourced: stop needs no signature check.
release=$(sed -n 's/^PROFILE_RELEASE_NODE=//p' "$BUNDLE/bin/profiles/$profile.conf" | head -n 1)
release=${release#\'}
release=${release%\'}
if [ -n "$release" ]; then
    KFD_NODE=${STACKPIN_KFD:-$release}
    card_released
fi
say PASS "stop: profile $profile stopped, container $name removed, processes gone"
