#!/bin/bash
# A registry for the site's nodes, from the bundle host: Debian's docker-registry
# (distribution 2.8) serving a folder beside the bundle.
#   bin/registry.sh start [--listen ADDR:PORT] [--read-only] [--tls-cert FILE --tls-key FILE]
#   bin/registry.sh stop | status
# --listen   where it binds (default 127.0.0.1:5000: loopback; give the site's own address
#            for other nodes, with TLS unless every engine lists it as insecure)
# --read-only  once seeded (bin/push.sh), restart it so: pulls work, pushes are refused
# Data, config, log and pid live in <bundle>.registry/ (STACKPIN_REGISTRY_DIR overrides).
# Exit codes: 0 ok; 2 usage; 8 host environment (no docker-registry, address taken);
# status: 3 when not running (the LSB init scripts' "program is not running").
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

EXIT_NOT_RUNNING=3  # status only, as LSB's init scripts answer it
usage="usage: registry.sh start [--listen ADDR:PORT] [--read-only] [--tls-cert FILE --tls-key FILE] | stop | status"
[ "$#" -ge 1 ] || die_with "$EXIT_USAGE" "$usage"
action=$1
shift
listen=127.0.0.1:5000 read_only=false cert="" key=""
while [ "$#" -gt 0 ]; do
    case $1 in
        --listen) [ "$#" -ge 2 ] || die_with "$EXIT_USAGE" "--listen needs ADDR:PORT"; listen=$2; shift ;;
        --listen=*) listen=${1#--listen=} ;;
        --read-only) read_only=true ;;
        --tls-cert) [ "$#" -ge 2 ] || die_with "$EXIT_USAGE" "--tls-cert needs a file"; cert=$2; shift ;;
        --tls-key) [ "$#" -ge 2 ] || die_with "$EXIT_USAGE" "--tls-key needs a file"; key=$2; shift ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) die_with "$EXIT_USAGE" "unknown argument $1 ($usage)" ;;
    esac
    shift
done
[[ "$listen" =~ ^([0-9.]+|\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$ ]] \
    || die_with "$EXIT_USAGE" "--listen '$listen' is not ADDR:PORT (e.g. 127.0.0.1:5000)"
port=${BASH_REMATCH[2]}
{ [ -z "$cert" ] && [ -z "$key" ]; } || { [ -f "$cert" ] && [ -f "$key" ]; } \
    || die_with "$EXIT_USAGE" "--tls-cert and --tls-key go together, each an existing file"

home=${STACKPIN_REGISTRY_DIR:-$BUNDLE.registry}
pidfile=$home/registry.pid

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

stop_registry() {
    if running; then
        local pid
        pid=$(cat "$pidfile")
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        ! kill -0 "$pid" 2>/dev/null || die_with "$EXIT_HOST" "registry (pid $pid) did not stop"
    fi
    rm -f "$pidfile"
}

case $action in
    status)
        if running; then say PASS "registry: running (pid $(cat "$pidfile")), $(sed -n 's/^# listen //p' "$home/config.yml")"
        else say INFO "registry: not running"; exit "$EXIT_NOT_RUNNING"; fi
        exit 0 ;;
    stop) stop_registry; say PASS "registry: stopped"; exit 0 ;;
    start) ;;
    *) die_with "$EXIT_USAGE" "$usage" ;;
esac

binary=$(command -v docker-registry || command -v registry || true)
[ -n "$binary" ] || die_with "$EXIT_HOST" "docker-registry is not installed: install it (Debian/Ubuntu: apt-get install docker-registry)"
stop_registry  # a restart (e.g. --read-only after seeding) replaces the running one
if (: <"/dev/tcp/${listen%:*}/$port") 2>/dev/null; then
    die_with "$EXIT_HOST" "$listen is taken: stop what listens there or choose --listen"
fi
mkdir -p "$home/data"
tls=""
if [ -n "$cert" ]; then
    tls=$(printf '  tls:\n    certificate: %s\n    key: %s\n' "$(realpath "$cert")" "$(realpath "$key")")
fi
# Deletes off, uploads abandoned for a week purged, read-only once seeded.
cat >"$home/config.yml" <<CONF
# listen $listen read-only $read_only
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $(cd "$home/data" && pwd -P)
  delete:
    enabled: false
  maintenance:
    uploadpurging:
      enabled: true
      age: 168h
      interval: 24h
      dryrun: false
    readonly:
      enabled: $read_only
http:
  addr: $listen
$tls
CONF
setsid "$binary" serve "$home/config.yml" >>"$home/registry.log" 2>&1 </dev/null &
echo "$!" >"$pidfile"
for _ in $(seq 100); do
    (: <"/dev/tcp/${listen%:*}/$port") 2>/dev/null && break
    running || die_with "$EXIT_HOST" "registry exited at start; the last lines of $home/registry.log: $(tail -n 2 "$home/registry.log" | tr '\n' ' ')"
    sleep 0.1
done
(: <"/dev/tcp/${listen%:*}/$port") 2>/dev/null || die_with "$EXIT_HOST" "registry did not open $listen within 10 s; see $home/registry.log"
mode=writable && [ "$read_only" = true ] && mode=read-only
say PASS "registry: serving $listen ($mode${cert:+, TLS}), data in $home/data"
