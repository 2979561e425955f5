#!/usr/bin/env bash
# Run ON THE GPU HOST: join the halves of a wheel carried in two calls (stage-issue22.sh),
# check its sha256 and install it into $SITE (default /tmp/site, kept while the machine is
# held). Usage: scripts/gpu/install-split-wheel.sh DIR   (DIR holds part-a, part-b, SHA256SUMS)
set -euo pipefail
DIR=${1:?usage: install-split-wheel.sh DIR}
SITE=${SITE:-/tmp/site}
for part in part-a part-b; do
  [ -f "$DIR/$part" ] || { echo "$DIR/$part is missing: the machine was given back between" \
    "the calls; carry .whl/fa2a again and copy it to $DIR" >&2; exit 8; }
done
name=$(awk '{print $2}' "$DIR/SHA256SUMS")
cat "$DIR/part-a" "$DIR/part-b" > "$DIR/$name"
(cd "$DIR" && sha256sum -c SHA256SUMS) || exit 8
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$DIR/$name"
echo "installed: $(basename "$SITE"/flash_attn-*.dist-info)"
