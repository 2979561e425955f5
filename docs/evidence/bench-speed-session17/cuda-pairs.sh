#!/usr/bin/env bash
# Whole-process seconds, the commands in turn: stackpin bundle export (HEAD, and OLD for
# the code before this session's change) of both CUDA images against docker save -o of
# both tags. Usage: cuda-pairs.sh ROUNDS [--no-cache]
set -euo pipefail
cd /work/main
cell=cuda130-sm90-torch2110-py311
rounds=$1; shift
extra=("$@")
tags=$(.venv/bin/stackpin images --json | python3 -c "
import json,sys
rows=json.load(sys.stdin)
print(' '.join(t for r in rows if r['cell']=='$cell' for t in r['tags'][:1]))")
t() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>>/tmp/b17/err.log; t1=$(date +%s.%N); python3 -c "print(f'{$t1-$t0:.1f}')"; }
new() { rm -rf /tmp/b17/bundle; .venv/bin/stackpin bundle export $cell --variant all -o /tmp/b17/bundle --sign-key /tmp/b17/keys/stackpin.key "${extra[@]}"; }
old() { rm -rf /tmp/b17/bundle; PYTHONPATH=/tmp/old/src .venv/bin/stackpin bundle export $cell --variant all -o /tmp/b17/bundle --sign-key /tmp/b17/keys/stackpin.key "${extra[@]}"; }
save() { rm -f /tmp/b17/save.tar; docker save $tags -o /tmp/b17/save.tar; }
echo "tags: $tags ${extra[*]}"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then n=$(t new); s=$(t save); o=$(t old); else o=$(t old); s=$(t save); n=$(t new); fi
  echo "round $r: export (HEAD) $n s, docker save $s s, export (abfcff6) $o s; HEAD/save $(python3 -c "print(f'{$n/$s:.2f}')") abfcff6/save $(python3 -c "print(f'{$o/$s:.2f}')")"
done
sha256sum /tmp/b17/bundle/images.tar.zst
rm -rf /tmp/b17/bundle /tmp/b17/save.tar
