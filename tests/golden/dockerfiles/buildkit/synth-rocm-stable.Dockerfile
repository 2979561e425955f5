# Rendered by stackpin 0.1.0 for cell synth-rocm, variant stable, for BuildKit.
# Do not edit: change pinning/*.toml and run `stackpin render synth-rocm --variant stable --builder buildkit`.
# Lock: 5def03d52bc4230485eca6f6e0d597b5b9a766060d4f2ec8fcff42b9f6776375 (2 wheels)

# ---- build tools, mounted into the steps below and never part of the image: the step
# ---- clamp (tools/clamp.py) and the per-layer bytecode compiler (tools/compile.py)
# ---- and uv 0.13.8, from its wheel pinned (sha256) in pinning/tools/installer.toml,
# ---- not in the cell's lock, and checked again here
FROM registry.example.invalid/rocm:9.9 AS tools
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=bind,source=tools,target=/tmp/tools \
    echo 'e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984  /tmp/tools/uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl' | sha256sum --check --quiet \
    && mkdir -p /opt/stackpin-tools \
    && python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
        /tmp/tools/uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl uv-0.13.8.data/scripts/uv /opt/stackpin-tools/uv \
    && chmod 0755 /opt/stackpin-tools/uv \
    && cp /tmp/tools/clamp.py /tmp/tools/compile.py /opt/stackpin-tools/

# ---- one stage: each install reads its layer's wheels from a bind mount of the build
# ---- context, so no wheel is in any layer and the environment is written once, in place.
# ---- Every step ends with the clamp: what it wrote gets mtime SOURCE_DATE_EPOCH (when
# ---- later), so the engine's own layers are reproducible (docs/reproducibility.md).
FROM registry.example.invalid/rocm:9.9
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Every mount target below and the files the engine mounts into /etc exist before the first
# RUN, with fixed times: made by the engine, 20.10's left the run's time in each layer.
ADD mount-stubs.tar /
# No index, no cache, no bytecode from imports: the installs read the locked wheelhouse
# only, and each install step compiles its own layer's bytecode, deterministically. ARG,
# not ENV: every RUN here sees them, the image (this stage is the final one) does not.
ARG PIP_NO_INDEX=1
ARG PIP_NO_CACHE_DIR=1
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PYTHONDONTWRITEBYTECODE=1
ARG SOURCE_DATE_EPOCH=1700000000
# ensurepip compiles the venv's own pip; SOURCE_DATE_EPOCH (an ARG of this stage) makes those
# pycs checked-hash, so they and the RECORD listing their hashes hold no build time. What
# of ensurepip's the lock pins goes here, in this layer: replaced by a later one it would
# leave whiteouts stamped with the time of the run (render.ENSUREPIP).
RUN --mount=type=bind,from=tools,source=/opt/stackpin-tools,target=/opt/stackpin-tools \
    t0=$(date +%s%N) && python3 -m venv /opt/stackpin/venv \
    && python3 /opt/stackpin-tools/clamp.py 1700000000 "$t0"

# Layer 1: ABI-bound wheels (torch and vendor builds), --no-deps.
# --no-deps so pip can never replace the vendor torch with a generic one from an index.
# The wheels are mounted read-only for this step alone: they reach no layer.
RUN --mount=type=bind,source=wheels/vendor,target=/tmp/wheelhouse/vendor \
    --mount=type=bind,from=tools,source=/opt/stackpin-tools,target=/opt/stackpin-tools \
    t0=$(date +%s%N) && /opt/stackpin-tools/uv pip install --python /opt/stackpin/venv/bin/python --offline --no-config --no-cache \
        --no-index --no-deps --require-hashes --no-build \
        --find-links /tmp/wheelhouse/vendor -r /tmp/wheelhouse/vendor/requirements.txt \
    && find /opt/stackpin/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'for f; do sed -i "/\/uv_cache\.json,/d" "${f%/uv_cache.json}/RECORD" && rm "$f"; done' sh {} + \
    && /opt/stackpin/venv/bin/python /opt/stackpin-tools/compile.py /tmp/wheelhouse/vendor/requirements.txt \
    && python3 /opt/stackpin-tools/clamp.py 1700000000 "$t0"

# Layer 2: the stack's wheels with compiled code, every one locked by sha256.
# Below the pure-Python wheels: these change least of the stack.
# The wheels are mounted read-only for this step alone: they reach no layer.
RUN --mount=type=bind,source=wheels/stack,target=/tmp/wheelhouse/stack \
    --mount=type=bind,from=tools,source=/opt/stackpin-tools,target=/opt/stackpin-tools \
    t0=$(date +%s%N) && /opt/stackpin-tools/uv pip install --python /opt/stackpin/venv/bin/python --offline --no-config --no-cache \
        --no-index --no-deps --require-hashes --no-build \
        --find-links /tmp/wheelhouse/stack -r /tmp/wheelhouse/stack/requirements.txt \
    && find /opt/stackpin/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'for f; do sed -i "/\/uv_cache\.json,/d" "${f%/uv_cache.json}/RECORD" && rm "$f"; done' sh {} + \
    && /opt/stackpin/venv/bin/python /opt/stackpin-tools/compile.py /tmp/wheelhouse/stack/requirements.txt \
    && python3 /opt/stackpin-tools/clamp.py 1700000000 "$t0"

# Guard: the build fails here, not at the site, when pip installed anything but the pins
# (pip check inside, less the requirements the cell drops by name in the matrix). Bytecode
# is not its job: each install step compiled its own layer's (tools/compile.py).
# The build files and verify/ are copied by RUN, not COPY, so the clamp covers them too;
# the vendor boundary is verify's own rule (L0.boundary's): one file, beside the guard;
# where the cell has an env script, whether this step sourced it is L0.dtk_env's rule.
# /tmp/context and /tmp/wheelhouse stay, empty: the first step laid them down as mount
# targets, and deleting them would leave whiteouts stamped with the time of the run.
RUN --mount=type=bind,source=stackpin,target=/tmp/context/stackpin \
    --mount=type=bind,source=verify,target=/tmp/context/verify \
    --mount=type=bind,from=tools,source=/opt/stackpin-tools,target=/opt/stackpin-tools \
    t0=$(date +%s%N) && cp -a /tmp/context/stackpin/. /opt/stackpin/ \
    && cp /tmp/context/verify/stackpin_verify/boundary.py /opt/stackpin/boundary.py \
    && /opt/stackpin/venv/bin/python /opt/stackpin/guard.py \
        --python cp312 --torch 2.5.0+rocm9.9 --numpy '>=1.26,<3' \
        --boundary /opt/stackpin/image.json \
    && rm -rf /root/.cache && find /tmp -mindepth 1 -maxdepth 1 ! -path /tmp/context ! -path /tmp/wheelhouse -exec rm -rf {} + \
    && mkdir /opt/stackpin/verify && cp -a /tmp/context/verify/. /opt/stackpin/verify/ \
    && python3 /opt/stackpin-tools/clamp.py 1700000000 "$t0"
# $PATH is the base image's: DTK and hyhal tools stay on it for `docker exec`. The base's
# PATH is kept beside it (one ENV: both read the base's value), and verify L0.path checks
# that the image's PATH still holds every entry of it.
ENV STACKPIN_BASE_PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin} \
    PATH=/opt/stackpin/venv/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin} \
    VIRTUAL_ENV=/opt/stackpin/venv \
    PYTHONPATH=/opt/stackpin/verify \
    STACKPIN_ATTENTION=sdpa
LABEL \
      io.stackpin.attention="sdpa" \
      io.stackpin.cell="synth-rocm" \
      io.stackpin.cell-json="{\"arch\":[\"gfx999\"],\"attention\":null,\"base\":{\"bootstrap\":null,\"digest\":\"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\"image\":\"registry.example.invalid/rocm:9.9\"},\"bitsandbytes\":\"disabled\",\"cpu_arch\":\"x86_64\",\"description\":\"synthetic ROCm cell: one variant, no env script\",\"dropped\":[],\"env\":{},\"env_script\":\"\",\"excluded\":{},\"glibc\":\"2.35\",\"id\":\"synth-rocm\",\"numpy\":\">=1.26,<3\",\"platform\":\"rocm\",\"platform_version\":\"9.9\",\"provided\":{},\"python\":\"cp312\",\"run\":{\"cap_add\":[],\"devices\":[],\"gpus\":\"\",\"group_add\":[],\"ipc\":\"\",\"security_opt\":[],\"shm_size\":\"\",\"visible_devices\":\"\",\"volumes\":[]},\"source_date_epoch\":1700000000,\"stack\":{\"numpy\":\"2.0.0\"},\"torch\":{\"filename\":\"torch-2.5.0+rocm9.9-cp312-cp312-manylinux_2_28_x86_64.whl\",\"sha256\":\"8888888888888888888888888888888888888888888888888888888888888888\",\"source\":\"index\"},\"variants\":[\"stable\"],\"vendor_wheels\":[]}" \
      io.stackpin.lock-digest="5def03d52bc4230485eca6f6e0d597b5b9a766060d4f2ec8fcff42b9f6776375" \
      io.stackpin.platform="rocm" \
      io.stackpin.source-date-epoch="1700000000" \
      io.stackpin.variant="stable" \
      io.stackpin.version="0.1.0" \
      org.opencontainers.image.base.digest="sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" \
      org.opencontainers.image.base.name="registry.example.invalid/rocm:9.9" \
      org.opencontainers.image.created="2023-11-14T22:13:20Z" \
      org.opencontainers.image.description="synthetic ROCm cell: one variant, no env script" \
      org.opencontainers.image.title="stackpin/synth-rocm" \
      org.opencontainers.image.vendor="stackpin" \
      org.opencontainers.image.version="stable-5def03d52bc4"
ENTRYPOINT ["/opt/stackpin/entrypoint.sh"]
CMD ["python", "-m", "stackpin_verify", "--levels", "0"]
