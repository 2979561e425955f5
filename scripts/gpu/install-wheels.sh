#!/usr/bin/env bash
# Run ON THE GPU HOST: install one carried wheel group into /tmp/site (survives only while
# the machine is held). Usage: scripts/gpu/install-wheels.sh .whl/fa
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$1"/*.whl
ls /tmp/site | grep -i -e dist-info | sort
