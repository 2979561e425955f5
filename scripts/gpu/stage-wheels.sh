#!/usr/bin/env bash
# Run HERE (a machine with network), from the repository root: downloads the wheels the H200
# host lacks (issue 6) into three groups, each under the device tool's 64 MiB upload limit:
#   .whl/fa   the shared FlashAttention build (59.8 MiB, alone)
#   .whl/b1   bitsandbytes (41 MiB manylinux wheel) + the larger unsloth needs
#   .whl/b2   unsloth, unsloth_zoo and the small pure-Python needs
# One version of each; the host already has torch 2.11.0+cu130, triton 3.6.0,
# transformers 5.17.0, peft 0.21.0, accelerate, numpy, pandas, pyarrow, ... (KINDS.md).
set -euo pipefail
FA=${FA_WHEEL:-../shared/wheels/flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl}
mkdir -p .whl/fa .whl/b1 .whl/b2
cp "$FA" .whl/fa/
dl() {
  local dest=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$dest" "$@"
}
for p in bitsandbytes==0.50.2 diffusers==0.42.1 hf_transfer==0.1.9 torchao==0.18.0 \
         xformers==0.0.35; do dl .whl/b1 "$p"; done
for p in unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0 datasets==4.8.5 tyro==1.0.17 \
         json5==0.17.3 nest-asyncio==1.6.0 structlog==26.1.0 pydantic==2.14.4 \
         pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
         docstring-parser==0.18.0 typeguard==4.6.1 dill==0.4.1 multiprocess==0.70.19 \
         importlib_metadata==10.2.0 msgspec==0.23.0 cut_cross_entropy==25.1.1 \
         certifi==2026.10.19.post1 typing_extensions==4.16.0; do dl .whl/b2 "$p"; done
du -sh .whl/fa .whl/b1 .whl/b2
