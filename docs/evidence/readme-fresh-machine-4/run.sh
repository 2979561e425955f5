#!/usr/bin/env bash
# README's two commands in order, as a new user: run under env -i from a fresh clone
# (see README.md beside this file for the exact invocation and what was stopped first).
cd "${1:?usage: run.sh CLONE}"
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) python3: $(command -v python3) $(python3 --version) docker daemon: $(docker info --format '{{.ServerVersion}}' 2>/dev/null || echo none)"
s=$SECONDS
bash scripts/demo.sh; rc1=$?
echo "command 1 exit $rc1 in $((SECONDS - s)) s at $(date -u +%FT%TZ)"
s=$SECONDS
bash scripts/test.sh; rc2=$?
echo "command 2 exit $rc2 in $((SECONDS - s)) s at $(date -u +%FT%TZ)"
