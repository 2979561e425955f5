# Rendered by stackpin 0.1.0 for cell synth-cuda, variant enhanced.
# Do not edit: change pinning/*.toml and run `stackpin render synth-cuda --variant enhanced`.
# Lock: 77f4a2f67dbb3d6b0a5e4a39ef92d940027d02abe1829b5cfa1ff74ef3819fb0 (3 wheels)

# ---- install stage: wheels in, nothing out but /opt/stackpin ------------------------
FROM registry.example.invalid/cuda:99.1 AS install
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# No index, no cache, no bytecode from imports: the install stage reads the locked
# wheelhouse only, and each install step compiles its own layer's bytecode
# (deterministically).
ENV PIP_NO_INDEX=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SOURCE_DATE_EPOCH=1700000000
RUN python3 -m venv /opt/stackpin/venv

# The build tools, in this stage's /tmp, which the final stage never copies: the
# per-layer bytecode compiler (tools/compile.py) and uv 0.13.8, from
# its wheel pinned (sha256) in pinning/tools/installer.toml, not in the cell's lock, and
# checked again here.
COPY tools/ /tmp/tools/
RUN echo 'e18a57b8b352eb7c8feb317b9f6f533c8f0ad9673fd6cf34bbe3cf1a9f6a8984  /tmp/tools/uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl' | sha256sum --check --quiet \
    && mkdir -p /tmp/uv \
    && python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
        /tmp/tools/uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl uv-0.13.8.data/scripts/uv /tmp/uv/uv \
    && chmod 0755 /tmp/uv/uv

# Layer 1: ABI-bound wheels (torch and vendor builds), --no-deps.
# --no-deps so pip can never replace the vendor torch with a generic one from an index.
COPY wheels/vendor/ /tmp/wheelhouse/vendor/
RUN /tmp/uv/uv pip install --python /opt/stackpin/venv/bin/python --offline --no-config --no-cache \
        --no-index --no-deps --require-hashes --no-build \
        --find-links /tmp/wheelhouse/vendor -r /tmp/wheelhouse/vendor/requirements.txt \
    && find /opt/stackpin/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'for f; do sed -i "/\/uv_cache\.json,/d" "${f%/uv_cache.json}/RECORD" && rm "$f"; done' sh {} + \
    && /opt/stackpin/venv/bin/python /tmp/tools/compile.py /tmp/wheelhouse/vendor/requirements.txt \
    && rm -rf /tmp/wheelhouse/vendor

# Layer 2: the stack's wheels with compiled code, every one locked by sha256.
# Below the pure-Python wheels: these change least of the stack.
COPY wheels/stack/ /tmp/wheelhouse/stack/
RUN /tmp/uv/uv pip install --python /opt/stackpin/venv/bin/python --offline --no-config --no-cache \
        --no-index --no-deps --require-hashes --no-build \
        --find-links /tmp/wheelhouse/stack -r /tmp/wheelhouse/stack/requirements.txt \
    && find /opt/stackpin/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'for f; do sed -i "/\/uv_cache\.json,/d" "${f%/uv_cache.json}/RECORD" && rm "$f"; done' sh {} + \
    && /opt/stackpin/venv/bin/python /tmp/tools/compile.py /tmp/wheelhouse/stack/requirements.txt \
    && rm -rf /tmp/wheelhouse/stack

# Layer 5: FlashAttention (enhanced variant only), --no-deps.
# Last, so the stable and enhanced images share every layer before it.
COPY wheels/attention/ /tmp/wheelhouse/attention/
RUN /tmp/uv/uv pip install --python /opt/stackpin/venv/bin/python --offline --no-config --no-cache \
        --no-index --no-deps --require-hashes --no-build \
        --find-links /tmp/wheelhouse/attention -r /tmp/wheelhouse/attention/requirements.txt \
    && find /opt/stackpin/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c 'for f; do sed -i "/\/uv_cache\.json,/d" "${f%/uv_cache.json}/RECORD" && rm "$f"; done' sh {} + \
    && /opt/stackpin/venv/bin/python /tmp/tools/compile.py /tmp/wheelhouse/attention/requirements.txt \
    && rm -rf /tmp/wheelhouse/attention

# Guard: the build fails here, not at the site, when pip installed anything but the pins
# (pip check inside, less the requirements the cell drops by name in the matrix). Bytecode
# is not its job: each install step compiled its own layer's (tools/compile.py).
COPY stackpin/ /opt/stackpin/
# The vendor boundary by verify's own rule (L0.boundary's): one file, beside the guard.
COPY verify/stackpin_verify/boundary.py /opt/stackpin/boundary.py
RUN /opt/stackpin/venv/bin/python /opt/stackpin/guard.py \
        --python cp312 --torch 2.5.0+cu991 --numpy '>=1.26,<3' \
        --boundary /opt/stackpin/image.json \
    && rm -rf /root/.cache /tmp/*

# ---- final stage: the base plus the finished environment, no wheel or cache ---------
FROM registry.example.invalid/cuda:99.1
COPY --from=install /opt/stackpin /opt/stackpin
COPY verify/ /opt/stackpin/verify/
# $PATH is the base image's: DTK and hyhal tools stay on it for `docker exec`. The base's
# PATH is kept beside it (one ENV: both read the base's value), and verify L0.path checks
# that the image's PATH still holds every entry of it.
ENV STACKPIN_BASE_PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin} \
    PATH=/opt/stackpin/venv/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin} \
    VIRTUAL_ENV=/opt/stackpin/venv \
    PYTHONPATH=/opt/stackpin/verify \
    STACKPIN_ATTENTION=flash_attn
LABEL \
      io.stackpin.attention="flash_attn" \
      io.stackpin.cell="synth-cuda" \
      io.stackpin.cell-json="{\"arch\":[\"sm_99\"],\"attention\":{\"filename\":\"flash_attn-1.0.0+cu991torch250-cp312-cp312-linux_x86_64.whl\",\"sha256\":\"7777777777777777777777777777777777777777777777777777777777777777\",\"source\":\"index\"},\"base\":{\"bootstrap\":null,\"digest\":\"sha256:9999999999999999999999999999999999999999999999999999999999999999\",\"image\":\"registry.example.invalid/cuda:99.1\"},\"bitsandbytes\":\"index\",\"cpu_arch\":\"x86_64\",\"description\":\"synthetic CUDA cell: index torch and FlashAttention\",\"dropped\":[],\"env\":{},\"env_script\":\"\",\"excluded\":{},\"glibc\":\"2.35\",\"id\":\"synth-cuda\",\"numpy\":\">=1.26,<3\",\"platform\":\"cuda\",\"platform_version\":\"99.1\",\"provided\":{},\"python\":\"cp312\",\"run\":{\"cap_add\":[],\"devices\":[],\"gpus\":\"\",\"group_add\":[],\"ipc\":\"\",\"security_opt\":[],\"shm_size\":\"\",\"visible_devices\":\"\",\"volumes\":[]},\"source_date_epoch\":1700000000,\"stack\":{\"numpy\":\"2.0.0\"},\"torch\":{\"filename\":\"torch-2.5.0+cu991-cp312-cp312-manylinux_2_28_x86_64.whl\",\"sha256\":\"6666666666666666666666666666666666666666666666666666666666666666\",\"source\":\"index\"},\"variants\":[\"stable\",\"enhanced\"],\"vendor_wheels\":[]}" \
      io.stackpin.lock-digest="77f4a2f67dbb3d6b0a5e4a39ef92d940027d02abe1829b5cfa1ff74ef3819fb0" \
      io.stackpin.platform="cuda" \
      io.stackpin.source-date-epoch="1700000000" \
      io.stackpin.variant="enhanced" \
      io.stackpin.version="0.1.0" \
      org.opencontainers.image.base.digest="sha256:9999999999999999999999999999999999999999999999999999999999999999" \
      org.opencontainers.image.base.name="registry.example.invalid/cuda:99.1" \
      org.opencontainers.image.created="2023-11-14T22:13:20Z" \
      org.opencontainers.image.description="synthetic CUDA cell: index torch and FlashAttention" \
      org.opencontainers.image.title="stackpin/synth-cuda" \
      org.opencontainers.image.vendor="stackpin" \
      org.opencontainers.image.version="enhanced-77f4a2f67dbb"
ENTRYPOINT ["/opt/stackpin/entrypoint.sh"]
CMD ["python", "-m", "stackpin_verify", "--levels", "0"]
