#!/usr/bin/env bash
# Run a command and report how much of the disk it took at its peak: `df` of the filesystem
# holding PATH (default /) sampled every 10 s while the command runs. How the CI figure in
# docs/benchmarks.md was measured: `bash scripts/disk-peak.sh bash .ci/run` on a fresh clone.
# Usage: scripts/disk-peak.sh [--path PATH] COMMAND [ARGS...]; exits with COMMAND's status.
set -uo pipefail

path=/
if [ "${1:-}" = --path ]; then path=${2:?--path takes a folder}; shift 2; fi
(($#)) || { echo "usage: scripts/disk-peak.sh [--path PATH] COMMAND [ARGS...]" >&2; exit 2; }

log=$(mktemp)
sample() { df -P -B1M "$path" | awk -v t="$(date +%s)" 'NR==2 {print t, $3, $4}' >>"$log"; }
sample
( while sleep 10; do sample; done ) &
sampler=$!
"$@"
rc=$?
kill "$sampler" 2>/dev/null
sample
awk 'NR==1 {base=$2; t0=$1; free=$3} $2>peak {peak=$2; at=$1-t0} $3<free {free=$3}
     END {printf "disk-peak: %.1f GiB used at the start, %.1f GiB more at the peak (+%d s), " \
          "%.1f GiB free at the least, %d samples\n", base/1024, (peak-base)/1024, at,
          free/1024, NR}' "$log" >&2
rm -f "$log"
exit "$rc"
