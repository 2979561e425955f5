#!/usr/bin/env bash
# Run HERE, from the repository root of the checkout the device tool sends (issue 22's
# device kit, scripts/gpu/PLAN-issue22.md). Puts into .whl/ (ignored by git):
#   .whl/mut    mutmut 3.8.1 and what it needs beyond the H200's own packages, cp312
#               manylinux wheels, one version each (3.6 MiB)
#   .whl/fa2a   the first half of the FlashAttention 2.8.3.post2 sm_90 wheel, and its sha256
#   .whl/fa2b   the second half: the whole wheel (59.8 MiB) and the checkout (~8 MiB) do not
#               fit one call's 64 MiB, so it travels in two calls and is joined there
#               (scripts/gpu/install-split-wheel.sh checks the sha256)
set -euo pipefail
FA=${FA_WHEEL:-../shared/wheels/flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl}
[ -f "$FA" ] || { echo "no FlashAttention wheel at $FA (set FA_WHEEL)" >&2; exit 8; }
rm -rf .whl/mut .whl/fa2a .whl/fa2b
mkdir -p .whl/mut .whl/fa2a .whl/fa2b
# The host has click, pytest, coverage, rich, pygments, markdown-it-py, pyyaml and
# typing-extensions (KINDS.md); click and rich are carried at versions mutmut 3.8.1 and
# textual ask for (click>=8.4.2, rich>=14.2.0), whatever the host's are. The host has no
# cryptography, which stackpin.bundle.trust imports (the first GPU-visible run errored on
# every test without it, 2026-12-02).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d .whl/mut mutmut==3.8.1 libcst==1.9.0 setproctitle==1.3.8 textual==8.2.8 click==8.5.1 \
  rich==15.0.0 mdit-py-plugins==0.7.0 platformdirs==4.14.9 linkify-it-py==2.2.0 \
  uc-micro-py==2.0.0 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
name=$(basename "$FA")
split -n 2 -a 1 "$FA" .whl/fa2-part-
mv .whl/fa2-part-a .whl/fa2a/part-a
mv .whl/fa2-part-b .whl/fa2b/part-b
sum=$(sha256sum "$FA" | cut -d' ' -f1)
for half in fa2a fa2b; do echo "$sum  $name" > ".whl/$half/SHA256SUMS"; done
du -sh .whl/mut .whl/fa2a .whl/fa2b
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
for carry in ".whl/mut .whl/fa2a" ".whl/fa2b"; do
  read -ra paths <<< "$carry"
  carried=$(du -cb "${paths[@]}" | tail -n 1 | cut -f1)
  echo "call carrying $carry: $(( (tracked + carried) / 1048576 )) MiB of 64 (checkout + carried)"
done
