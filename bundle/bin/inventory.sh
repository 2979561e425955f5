#!/bin/bash
# What this site holds, for a delta bundle: bin/inventory.sh [-o FILE]
# One "layer CHAIN_ID DIFF_ID" line per layer of every image the engine holds (Docker or
# Podman: STACKPIN_ENGINE), closed by the sha256 of every line above it. Take the file to
# the build host: `stackpin bundle export CELL --against FILE` then leaves out every layer
# listed here. Reads nothing of the bundle and changes nothing; without -o it prints the
# inventory. Exit codes: 0 written; 2 usage; 8 no engine answers.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

out=""
while [ "$#" -gt 0 ]; do
    case $1 in
        -o|--out) [ "$#" -ge 2 ] || die_with "$EXIT_USAGE" "$1 needs a file"; out=$2; shift ;;
        --out=*) out=${1#--out=} ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) die_with "$EXIT_USAGE" "unknown argument $1 (usage: inventory.sh [-o FILE])" ;;
    esac
    shift
done
need sha256sum "it closes the inventory with a checksum"
need_engine "it lists the layers the engine holds"
version=$(engine version --format '{{.Server.Version}}' 2>/dev/null | tr -cd 'A-Za-z0-9._+~-' || true)
[ -n "$version" ] || die_with "$EXIT_HOST" "$ENGINE does not answer: start it (or set STACKPIN_ENGINE), then run inventory.sh again"

body=$(mktemp)
trap 'rm -f "$body"' EXIT
{
    printf 'stackpin-inventory 1\n'
    printf 'engine %s %s\n' "$ENGINE" "$version"
    engine_layers | sed 's/^/layer /'
} >"$body"
printf 'sha256 %s\n' "$(sha256sum <"$body" | cut -c1-64)" >>"$body"
layers=$(grep -c '^layer ' "$body" || true)
if [ -z "$out" ]; then
    cat "$body"
else
    cp "$body" "$out.partial" && mv -f "$out.partial" "$out"
fi
say PASS "inventory: $layers layer(s) held by $ENGINE $version${out:+ -> $out}; on the build host: stackpin bundle export CELL --against ${out:-FILE}" >&2
