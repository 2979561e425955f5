#!/usr/bin/env bash
# Run ON ONE H200 from the repository root, no carried wheels: L0 + L1 three times in a row,
# to show the GEMM figure against triton's do_bench on the same product (issue 6) and how much
# it moves between runs. Writes $OUT/l1run{1,2,3}/report.*.
set -uo pipefail
. scripts/gpu/env.sh
OUT=${OUT:-/tmp/stackpin-evidence}
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
for i in 1 2 3; do
  echo "+ PYTHONPATH=verify python3 -m stackpin_verify --levels 0,1 --image-info scripts/gpu/image-h200-bnb-disabled.json --out-dir $OUT/l1run$i"
  PYTHONPATH=verify timeout 120 python3 -m stackpin_verify --levels 0,1 \
    --image-info scripts/gpu/image-h200-bnb-disabled.json --out-dir "$OUT/l1run$i"
  echo "rc=$?"
  python3 -c "import json,sys; [print(c['name'], c['status'], round(c['metrics'].get('tflops',0),1), round(c['metrics'].get('do_bench_tflops',0),1), round(c['metrics'].get('ratio_vs_do_bench',0),4)) for c in json.load(open(sys.argv[1]))['checks'] if c['name'].startswith('L1')]" "$OUT/l1run$i/report.json"
done
date -u
