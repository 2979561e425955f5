#!/usr/bin/env bash
# README command 1: from a fresh Debian/Ubuntu host to a built, verified and bundled
# CPU default image. Each stage prints one line saying what it did and where.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
sp=.venv/bin/stackpin
$sp matrix check >/dev/null && echo "check: every shipped cell is consistent (stackpin matrix check)"
$sp wheels fetch
$sp build
$sp images
if $sp verify --help >/dev/null 2>&1; then $sp verify; fi
if $sp bundle --help >/dev/null 2>&1; then $sp bundle export -o out/bundle --force; fi
