#!/usr/bin/env bash
# Run HERE (a machine with network), from the repository root: downloads the wheels that
# scripts/gpu/studio-wheels.txt pins, built for the H200 host's CPython 3.12, and splits them
# into two groups that each fit the device tool's 64 MiB per call (with the working tree):
#   .whl/studio-a  bitsandbytes (43 MB) and the next-largest compiled wheels (~59 MB)
#   .whl/studio-b  unsloth (28 MB, ships studio/) and everything else (~43 MB)
# Both folders are ignored by git (.git/info/exclude: /.whl/).
set -euo pipefail
ALL=.whl/studio-all
mkdir -p "$ALL" .whl/studio-a .whl/studio-b
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$ALL" -r scripts/gpu/studio-wheels.txt
for wheel in "$ALL"/*.whl; do
  case $(basename "$wheel") in
    bitsandbytes-*|cryptography-*|hf_transfer-*|torchao-*|pydantic_core-*|beartype-*|pygments-*)
      ln -f "$wheel" .whl/studio-a/ ;;
    *) ln -f "$wheel" .whl/studio-b/ ;;
  esac
done
du -sh .whl/studio-a .whl/studio-b
