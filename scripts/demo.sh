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
$sp verify | tail -n 3
[ -f out/keys/stackpin.key ] || $sp keys generate -o out/keys
$sp bundle export -o out/bundle --sign-key out/keys/stackpin.key --force
echo "demo: done; the site loads out/bundle with STACKPIN_PUBKEY=out/keys/stackpin.pub and bin/preflight.sh, bin/load.sh, bin/verify.sh"
