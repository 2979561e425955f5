#!/bin/bash
cd "$1"
start=$(date +%s)
echo "== command 1 start $(date -u +%FT%TZ)"
bash scripts/demo.sh; rc1=$?
echo "== command 1 rc=$rc1 in $(( $(date +%s) - start )) s"
[ "$rc1" = 0 ] || exit "$rc1"
start=$(date +%s)
echo "== command 2 start $(date -u +%FT%TZ)"
bash scripts/test.sh; rc2=$?
echo "== command 2 rc=$rc2 in $(( $(date +%s) - start )) s"
exit "$rc2"
