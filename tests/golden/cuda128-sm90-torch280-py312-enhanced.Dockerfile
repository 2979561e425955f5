# Rendered by stackpin 0.1.0 for cell cuda128-sm90-torch280-py312, variant enhanced.
# Do not edit: change pinning/*.toml and run `stackpin render cuda128-sm90-torch280-py312 --variant enhanced`.
# Lock: none yet (run `stackpin wheels fetch`); a build refuses an unlocked cell

# ---- install stage: wheels in, nothing out but /opt/stackpin ------------------------
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS install
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# No index, no cache, no bytecode from imports: the install stage reads the locked
# wheelhouse only, and bytecode is compiled once, deterministically, after the guard.
ENV PIP_NO_INDEX=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SOURCE_DATE_EPOCH=1767225600
RUN python3 -m venv /opt/stackpin/venv

# Layer 1: ABI-bound wheels (torch and vendor builds), --no-deps.
# --no-deps so pip can never replace the vendor torch with a generic one from an index.
COPY wheels/vendor/ /tmp/wheelhouse/vendor/
RUN /opt/stackpin/venv/bin/pip install --no-index --no-deps --require-hashes --no-compile \
        --find-links /tmp/wheelhouse/vendor -r /tmp/wheelhouse/vendor/requirements.txt \
    && rm -rf /tmp/wheelhouse/vendor

# Layer 2: the rest of the stack, every transitive wheel locked by sha256.
# Changing one stack pin rebuilds from here; the torch layer above stays cached.
COPY wheels/stack/ /tmp/wheelhouse/stack/
RUN /opt/stackpin/venv/bin/pip install --no-index --no-deps --require-hashes --no-compile \
        --find-links /tmp/wheelhouse/stack -r /tmp/wheelhouse/stack/requirements.txt \
    && rm -rf /tmp/wheelhouse/stack

# Layer 3: FlashAttention (enhanced variant only), --no-deps.
# Last, so the stable and enhanced images share every layer before it.
COPY wheels/attention/ /tmp/wheelhouse/attention/
RUN /opt/stackpin/venv/bin/pip install --no-index --no-deps --require-hashes --no-compile \
        --find-links /tmp/wheelhouse/attention -r /tmp/wheelhouse/attention/requirements.txt \
    && rm -rf /tmp/wheelhouse/attention

# Guard: the build fails here, not at the site, when pip installed anything but the pins.
COPY stackpin/ /opt/stackpin/
RUN /opt/stackpin/venv/bin/pip check \
    && /opt/stackpin/venv/bin/python /opt/stackpin/guard.py \
        --python cp312 --torch 2.8.0 --numpy '<3' \
        --compile /opt/stackpin/venv/lib \
    && rm -rf /root/.cache /tmp/*

# ---- final stage: the base plus the finished environment, no wheel or cache ---------
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
COPY --from=install /opt/stackpin /opt/stackpin
COPY verify/ /opt/stackpin/verify/
ENV PATH=/opt/stackpin/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/stackpin/venv \
    PYTHONPATH=/opt/stackpin/verify \
    STACKPIN_ATTENTION=flash_attn \
    HF_HUB_OFFLINE="1"
LABEL \
      io.stackpin.attention="flash_attn" \
      io.stackpin.cell="cuda128-sm90-torch280-py312" \
      io.stackpin.cell-json="{\"arch\":[\"sm_90\"],\"attention\":{\"filename\":\"flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl\",\"sha256\":\"\",\"source\":\"vendor\"},\"base\":{\"bootstrap\":null,\"digest\":\"\",\"image\":\"nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04\"},\"bitsandbytes\":\"index\",\"cpu_arch\":\"x86_64\",\"description\":\"CUDA 12.8, torch 2.8.0 (public index), upstream FlashAttention 2.8.3 wheel\",\"env\":{\"HF_HUB_OFFLINE\":\"1\"},\"env_script\":\"\",\"glibc\":\"2.39\",\"id\":\"cuda128-sm90-torch280-py312\",\"numpy\":\"<3\",\"platform\":\"cuda\",\"platform_version\":\"12.8\",\"python\":\"cp312\",\"run\":{\"cap_add\":[],\"devices\":[],\"gpus\":\"all\",\"group_add\":[],\"ipc\":\"\",\"security_opt\":[],\"shm_size\":\"16g\",\"volumes\":[]},\"source_date_epoch\":1767225600,\"stack\":{\"accelerate\":\"1.10.1\",\"bitsandbytes\":\"0.47.0\",\"datasets\":\"4.1.1\",\"numpy\":\"2.2.6\",\"peft\":\"0.17.1\",\"safetensors\":\"0.6.2\",\"transformers\":\"4.57.6\",\"triton\":\"3.4.0\",\"trl\":\"0.23.1\",\"unsloth\":\"2025.10.12\"},\"torch\":{\"filename\":\"torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl\",\"sha256\":\"\",\"source\":\"index\"},\"variants\":[\"stable\",\"enhanced\"],\"vendor_wheels\":[]}" \
      io.stackpin.lock-digest="unlocked" \
      io.stackpin.platform="cuda" \
      io.stackpin.source-date-epoch="1767225600" \
      io.stackpin.variant="enhanced" \
      io.stackpin.version="0.1.0" \
      org.opencontainers.image.base.name="nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04" \
      org.opencontainers.image.created="2026-01-01T00:00:00Z" \
      org.opencontainers.image.description="CUDA 12.8, torch 2.8.0 (public index), upstream FlashAttention 2.8.3 wheel" \
      org.opencontainers.image.title="stackpin/cuda128-sm90-torch280-py312" \
      org.opencontainers.image.vendor="stackpin" \
      org.opencontainers.image.version="enhanced-unlocked"
ENTRYPOINT ["/opt/stackpin/entrypoint.sh"]
CMD ["python", "-m", "stackpin_verify", "--levels", "0"]
