#!/usr/bin/env bash
# Run ON ONE H200 from the repository root (issue 20, item 3): stable versus enhanced.
# L3 and L5 of the suite, which now time the attention package against SDPA's default
# backend (L3.variants.attention: the shapes verify/stackpin_verify/workload.json declares,
# Studio's default training batches fwd+bwd and prefills fwd, triton.testing.do_bench) and
# a LoRA step on the first training batch with each
# attention (L5.variants.train_step), and write the report with its recommendation.
# About a minute on an H200; one command:
#
#   bash scripts/gpu/recommend.sh        # after install-wheels.sh put the package in $SITE
#
# Environment: OUT (results; the device tool sets it), SITE (where the attention package
# and its closure were installed, default /tmp/site), PYTHON (default python3; a venv's
# python works too), IMAGE_INFO (default: scripts/gpu/image-h200-fa4.json when $SITE holds
# flash-attn-4, else image-h200-fa.json: the host stack described as an enhanced image,
# labelled a bare GPU host, never a cell's lock; the image.json of a replayed lock for item 2).
# Writes $OUT/recommend/report.{json,xml} and $OUT/recommend/run.log.
set -uo pipefail
. scripts/gpu/env.sh
OUT=${OUT:-/tmp/stackpin-evidence}
SITE=${SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
if [ -z "${IMAGE_INFO:-}" ]; then
  IMAGE_INFO=scripts/gpu/image-h200-fa.json
  ls -d "$SITE"/flash_attn_4-*.dist-info >/dev/null 2>&1 && IMAGE_INFO=scripts/gpu/image-h200-fa4.json
fi
DIR="$OUT/recommend"
mkdir -p "$DIR" "$SITE"

{
  echo "== host"
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  "$PYTHON" --version
  echo "== attention package and timer (from $SITE)"
  # site.addsitedir reads $SITE's .pth files, which pip --target leaves unread: the CuTe
  # DSL behind FlashAttention 4 is found through one (issue 20).
  PYTHONPATH="$SITE:verify" "$PYTHON" - "$SITE" <<'PY'
import site, sys
site.addsitedir(sys.argv[1])
import importlib.metadata as md
for dist in ("torch", "triton", "transformers", "peft", "flash-attn", "flash-attn-4",
             "nvidia-cutlass-dsl", "quack-kernels"):
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist}: not installed")
from stackpin_verify import attn_package
try:
    found = attn_package.discover()
    print("attention package:", found.label if found else "none")
except attn_package.PackageBroken as exc:
    print("attention package broken:", exc)
PY
  echo "== L3 + L5 with the stable-versus-enhanced timings"
  # bf16 only: the dtype the cells train in, and half of L3's correctness cases (cheaper).
  echo "+ PYTHONPATH=$SITE:verify $PYTHON -m stackpin_verify --levels 3,5 --dtype bf16 --image-info $IMAGE_INFO --out-dir $DIR"
  PYTHONPATH="$SITE:verify" timeout 420 "$PYTHON" -c \
    "import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); sys.argv[0] = 'stackpin_verify'; runpy.run_module('stackpin_verify', run_name='__main__', alter_sys=True)" \
    "$SITE" --levels 3,5 --dtype bf16 --image-info "$IMAGE_INFO" --out-dir "$DIR"
  echo "rc=$?"
  echo "== the numbers the recommendation rests on"
  "$PYTHON" - "$DIR/report.json" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except OSError as exc:
    sys.exit(f"no report: the suite died ({exc})")
checks = {c["name"]: c for c in report["checks"]}
attention = checks.get("L3.variants.attention", {})
print("L3.variants.attention:", attention.get("status"), attention.get("reason", ""))
for row in attention.get("metrics", {}).get("cases", []):
    ms = f"{row.get('enhanced_ms', float('nan')):8.4f} ms vs {row.get('stable_ms', float('nan')):8.4f} ms"
    print(f"  {row['shape']:<28} {ms}  ratio {row.get('ratio', float('nan')):.3f}  {row.get('error', '')}")
step = checks.get("L5.variants.train_step", {})
metrics = step.get("metrics", {})
print("L5.variants.train_step:", step.get("status"), step.get("reason", ""))
print("  enhanced", metrics.get("enhanced_ms"), "ms, stable", metrics.get("stable_ms"), "ms,",
      "logits rel diff", metrics.get("logits_mean_rel_diff"))
advice = report.get("recommendation") or {}
print("recommendation:", advice.get("line"))
if advice.get("note"):
    print(advice["note"])
PY
  date -u
} 2>&1 | tee "$DIR/run.log"
