#!/usr/bin/env bash
cd /root/fresh
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) docker: $(command -v docker || echo none)"
s=$SECONDS
bash scripts/demo.sh; rc1=$?
echo "command 1 exit $rc1 in $((SECONDS - s)) s at $(date -u +%FT%TZ)"
s=$SECONDS
bash scripts/test.sh; rc2=$?
echo "command 2 exit $rc2 in $((SECONDS - s)) s at $(date -u +%FT%TZ)"
