#!/usr/bin/env bash
# Run ON ONE H200 from the repository root, after install-wheels.sh for .whl/fa, .whl/b1 and
# .whl/b2 (issue 6). Writes into $OUT:
#   h200/report.{json,xml}   L0-L6 in bf16, host stack + carried wheels, image-h200.json
#   l4off/report.{json,xml}  L4 with the image declaring bitsandbytes disabled, wheels off path
#   l4bad/report.{json,xml}  L4 with the image declaring it disabled while it is installed
#   l4absent.json            L4 with the image declaring it from the index, wheels off path
set -uo pipefail
. scripts/gpu/env.sh
OUT=${OUT:-/tmp/stackpin-evidence}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
cmd() { echo "+ $*"; "$@"; echo "rc=$?"; }

echo "== host"
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 --version
echo "== versions (host site-packages + $SITE)"
PYTHONPATH=$SITE python3 - <<'PY'
import importlib.metadata as md
for d in ("torch", "triton", "transformers", "peft", "accelerate", "huggingface-hub",
          "tokenizers", "safetensors", "numpy", "flash-attn", "bitsandbytes", "unsloth",
          "unsloth-zoo", "trl", "datasets", "xformers", "torchao", "diffusers", "pydantic"):
    try:
        print(f"{d}=={md.version(d)}")
    except md.PackageNotFoundError:
        print(f"{d}: not installed")
PY

echo "== unsloth import probe (full traceback; the suite records the innermost frame)"
cmd env PYTHONPATH=$SITE:verify timeout 150 python3 -c \
  "import unsloth; print('unsloth imported', unsloth.__version__)"

echo "== L0-L6 bf16, host stack + carried wheels"
cmd env PYTHONPATH=$SITE:verify timeout 330 python3 -m stackpin_verify --levels 0,1,2,3,4,5,6 \
  --dtype bf16 --image-info scripts/gpu/image-h200.json --out-dir "$OUT/h200"
if [ ! -f "$OUT/h200/report.json" ]; then
  echo "== no report: the suite died; again without unsloth on the path"
  mv "$SITE/unsloth" /tmp/unsloth.off
  cmd env PYTHONPATH=$SITE:verify timeout 200 python3 -m stackpin_verify --levels 0,1,2,3,4,5,6 \
    --dtype bf16 --image-info scripts/gpu/image-h200.json --out-dir "$OUT/h200"
  mv /tmp/unsloth.off "$SITE/unsloth"
fi

echo "== L4, image declares bitsandbytes disabled, carried wheels off the path (expect pass)"
cmd env PYTHONPATH=verify python3 -m stackpin_verify --levels 4 \
  --image-info scripts/gpu/image-h200-bnb-disabled.json --out-dir "$OUT/l4off"
echo "== L4, image declares it disabled but bitsandbytes is installed (expect required fail)"
cmd env PYTHONPATH=$SITE:verify python3 -m stackpin_verify --levels 4 \
  --image-info scripts/gpu/image-h200-bnb-disabled.json --out-dir "$OUT/l4bad"
echo "== L4, image declares it from the index, wheels off the path (expect required fail)"
echo "+ PYTHONPATH=verify python3 -m stackpin_verify --levels 4 --image-info scripts/gpu/image-h200.json --out-dir /tmp/l4absent --json > $OUT/l4absent.json"
PYTHONPATH=verify python3 -m stackpin_verify --levels 4 --image-info scripts/gpu/image-h200.json \
  --out-dir /tmp/l4absent --json > "$OUT/l4absent.json"
echo "rc=$?"
python3 -c "import json,sys; [print(c['name'], c['status'], c['reason']) for c in json.load(open(sys.argv[1]))['checks']]" "$OUT/l4absent.json"
date -u
