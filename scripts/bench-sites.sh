#!/usr/bin/env bash
# Figures for docs/benchmarks.md, issue 25 (sites beyond one machine), on the CPU default:
#   1. the delta bundle against a site that holds the layers below the stack (one stack pin
#      changed) and below torch (torch changed), against the full bundle;
#   2. bin/push.sh against a bare `skopeo copy` of the same image (farm-bench pairs), and a
#      second push of the unchanged image;
#   3. a node taking the image: bin/pull.sh from the site registry against bin/load.sh of
#      the bundle (farm-bench pairs, the image removed before each run).
# The registry runs in the Docker 28 classic engine's namespace (scripts/setup-engines.sh),
# which is also the "node". Needs the CPU default built with --builder buildkit here.
# Usage: scripts/bench-sites.sh WORK_DIR [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(realpath -m "${1:?usage: bench-sites.sh WORK_DIR [RUNS]}")
runs=${2:-3}
cell=cpu-bookworm-torch2130-py311
node=unix:///run/stackpin-engines/docker28-classic/docker.sock
netns=(nsenter --net=/run/netns/stackpin-docker28-classic)
stackpin=.venv/bin/stackpin
mkdir -p "$work"
say() { printf 'bench-sites: %s\n' "$*"; }

[ -f "$work/keys/stackpin.key" ] || $stackpin keys generate -o "$work/keys" >/dev/null
export STACKPIN_PUBKEY=$work/keys/stackpin.pub
if [ ! -f "$work/full/manifest.sig" ]; then
    say "full bundle"
    /usr/bin/time -f "export wall %e s" $stackpin bundle export "$cell" -o "$work/full" \
        --sign-key "$work/keys/stackpin.key" --force
fi

# The layers below the stack and below torch, from the image's own history (BuildKit: one
# layer per RUN/COPY), written as inventories a site would send.
.venv/bin/python - "$work" <<'EOF'
import hashlib, io, json, sys, tarfile
from pathlib import Path
import zstandard
from stackpin.bundle.delta import chain_ids
work = Path(sys.argv[1])
manifest = json.loads((work / "full" / "manifest.json").read_bytes())
config_digest = manifest["images"][0]["config_digest"].removeprefix("sha256:")
sizes = {}
with (work / "full" / "images.tar.zst").open("rb") as raw, zstandard.ZstdDecompressor(
        ).stream_reader(raw, read_across_frames=True) as stream, tarfile.open(
        fileobj=stream, mode="r|") as tar:
    for member in tar:
        sizes["sha256:" + member.name.rsplit("/", 1)[-1]] = member.size
        if member.name == f"blobs/sha256/{config_digest}":
            config = json.loads(tar.extractfile(member).read())
history = [h for h in config["history"] if not h.get("empty_layer")]
diffs = config["rootfs"]["diff_ids"]
assert len(history) == len(diffs), (len(history), len(diffs))
for i, (h, d) in enumerate(zip(history, diffs)):
    print(f"layer {i}: {d[:19]} {sizes.get(d, 0) / 2**20:8.1f} MiB  {h.get('created_by', '')[:100]}")
# The install steps name their wheelhouse (the bind mount's target) in the command.
below = {"stack": next(i for i, h in enumerate(history) if "wheelhouse/stack" in h.get("created_by", "")),
         "torch": next(i for i, h in enumerate(history) if "wheelhouse/vendor" in h.get("created_by", ""))}
for name, count in below.items():
    body = "stackpin-inventory 1\nengine bench below-" + name + "\n"
    body += "".join(f"layer {c} {d}\n" for c, d in zip(chain_ids(diffs[:count]), diffs[:count]))
    body += f"sha256 {hashlib.sha256(body.encode()).hexdigest()}\n"
    (work / f"below-{name}.inventory").write_text(body)
    print(f"below-{name}: {count} layers held")
EOF
for change in stack torch; do
    $stackpin bundle export "$cell" -o "$work/delta-$change" --sign-key "$work/keys/stackpin.key" \
        --force --against "$work/below-$change.inventory" >/dev/null
done
full=$(stat -c %s "$work/full/images.tar.zst")
for change in stack torch; do
    part=$(stat -c %s "$work/delta-$change/images.tar.zst")
    awk -v c="$change" -v p="$part" -v f="$full" \
        'BEGIN { printf "delta after a %s change: %.1f MiB of %.1f MiB (%.1f %%)\n", c, p/1048576, f/1048576, 100*p/f }'
done

say "registry in the node's namespace"
export STACKPIN_REGISTRY_DIR=$work/registry
rm -rf "$STACKPIN_REGISTRY_DIR"
"${netns[@]}" bash "$work/full/bin/registry.sh" start --listen 127.0.0.1:5999
trap '"${netns[@]}" bash "$work/full/bin/registry.sh" stop >/dev/null 2>&1 || true' EXIT
# Each run pushes into a repository of its own (a fresh prefix), so nothing is skipped.
cat >"$work/push-fresh.sh" <<EOF
#!/bin/bash
exec ${netns[*]} bash $work/full/bin/push.sh 127.0.0.1:5999/run\$(date +%s%N) --plain-http
EOF
image=$(sed -n 's/^PROFILE_IMAGE_ID=//p' "$work/full/bin/profiles/stable.conf")
cat >"$work/skopeo-fresh.sh" <<EOF
#!/bin/bash
exec ${netns[*]} skopeo copy --quiet --dest-tls-verify=false docker-daemon:$image \
    docker://127.0.0.1:5999/skopeo\$(date +%s%N)/$cell:stable
EOF
chmod +x "$work/push-fresh.sh" "$work/skopeo-fresh.sh"
farm-bench -n "$runs" --warmup 0 --timeout 3600 --vs "$work/skopeo-fresh.sh" -- "$work/push-fresh.sh"
say "second push of the unchanged image (same repository)"
"${netns[@]}" bash "$work/full/bin/push.sh" 127.0.0.1:5999/site --plain-http >/dev/null
farm-bench -n "$runs" --warmup 0 --timeout 3600 -- \
    "${netns[@]}" bash "$work/full/bin/push.sh" 127.0.0.1:5999/site --plain-http

say "a node: pull from the site registry against load of the bundle"
mkdir -p "$work/node"
cp "$work/full/manifest.json" "$work/full/manifest.sig" "$work/full/SHA256SUMS" "$work/node/"
rm -rf "$work/node/bin" && cp -r "$work/full/bin" "$work/node/bin"
cat >"$work/pull-fresh.sh" <<EOF
#!/bin/bash
DOCKER_HOST=$node docker rmi -f $image >/dev/null 2>&1
DOCKER_HOST=$node exec ${netns[*]} bash $work/node/bin/pull.sh 127.0.0.1:5999/site
EOF
cat >"$work/load-fresh.sh" <<EOF
#!/bin/bash
DOCKER_HOST=$node docker rmi -f $image >/dev/null 2>&1
DOCKER_HOST=$node exec bash $work/full/bin/load.sh
EOF
chmod +x "$work/pull-fresh.sh" "$work/load-fresh.sh"
farm-bench -n "$runs" --warmup 0 --timeout 3600 --vs "$work/load-fresh.sh" -- "$work/pull-fresh.sh"
DOCKER_HOST=$node docker rmi -f "$image" >/dev/null 2>&1 || true
du -sh "$STACKPIN_REGISTRY_DIR"
