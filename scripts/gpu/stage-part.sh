#!/usr/bin/env bash
# Device call 1..N of issue 20's kit (scripts/gpu/PLAN-issue20.md), ON THE GPU HOST from the
# repository root: keep one carried part of the staged lock in /tmp/lockparts, checked
# against .whl/lock/parts.sha256 (carried beside every part), and say which parts the
# machine now holds. /tmp survives only while the machine stays warm (30 s between calls):
# a part missing from an earlier call means the machine was handed back and a fresh one
# answered; the script says so and exits 8, and the sequence starts again at part 00.
# Usage: bash scripts/gpu/stage-part.sh NN   (LOCKPARTS: where parts are kept, default /tmp/lockparts)
set -uo pipefail
parts=${LOCKPARTS:-/tmp/lockparts}
n=${1:?usage: stage-part.sh NN (the part number, 00, 01, ...)}
[[ "$n" =~ ^[0-9][0-9]$ ]] || { echo "stage-part: part number $n is not two digits (00, 01, ...)"; exit 2; }
sums=.whl/lock/parts.sha256
part=.whl/lock/part-$n
[ -f "$sums" ] || { echo "stage-part: $sums was not carried: add it to the carry list"; exit 2; }
[ -f "$part" ] || { echo "stage-part: $part was not carried: carry [\"$part\", \"$sums\"]"; exit 2; }
mkdir -p "$parts"
cp "$part" "$sums" "$parts"/
total=$(wc -l <"$sums")
( cd "$parts" && grep -E " part-($n)$" parts.sha256 | sha256sum --check --quiet ) \
    || { echo "stage-part: part-$n differs from parts.sha256: carry it again"; exit 8; }
held=0 missing=()
while read -r _sum name; do
    if [ -f "$parts/$name" ]; then held=$((held + 1)); else missing+=("$name"); fi
done <"$sums"
echo "stage-part: part-$n ok ($(du -m "$part" | cut -f1) MiB); the machine holds $held of $total parts"
for name in "${missing[@]+"${missing[@]}"}"; do
    if [[ "$name" < "part-$n" ]]; then
        echo "stage-part: $name from an earlier call is gone: the machine was replaced (cold)." \
             "Start again at part 00, with no pause between calls."
        exit 8
    fi
done
[ "$held" = "$total" ] && echo "stage-part: every part is here: next, bash scripts/gpu/studio-replay.sh"
exit 0
