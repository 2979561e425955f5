# Rendered by stackpin 0.1.0 for cell cpu-bookworm-torch2130-py311, variant stable.
# Do not edit: change pinning/*.toml and run `stackpin render cpu-bookworm-torch2130-py311 --variant stable`.
# Lock: 98e3c03928e3d5d579f30aebd3a423e1dc758a6c5f42f1d0526e3a19bed049c7 (50 wheels)

# ---- install stage: wheels in, nothing out but /opt/stackpin ------------------------
FROM stackpin/base-bookworm:eff575722d7d AS install
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# No index, no cache, no bytecode from imports: the install stage reads the locked
# wheelhouse only, and bytecode is compiled once, deterministically, after the guard.
ENV PIP_NO_INDEX=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SOURCE_DATE_EPOCH=1735689600
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

# Guard: the build fails here, not at the site, when pip installed anything but the pins.
COPY stackpin/ /opt/stackpin/
RUN /opt/stackpin/venv/bin/pip check \
    && /opt/stackpin/venv/bin/python /opt/stackpin/guard.py \
        --python cp311 --torch 2.13.0+cpu --numpy '<2' \
        --compile /opt/stackpin/venv/lib \
    && rm -rf /root/.cache /tmp/*

# ---- final stage: the base plus the finished environment, no wheel or cache ---------
FROM stackpin/base-bookworm:eff575722d7d
COPY --from=install /opt/stackpin /opt/stackpin
COPY verify/ /opt/stackpin/verify/
ENV PATH=/opt/stackpin/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/stackpin/venv \
    PYTHONPATH=/opt/stackpin/verify \
    STACKPIN_ATTENTION=sdpa \
    HF_HUB_OFFLINE="1" \
    OMP_NUM_THREADS="2" \
    TRANSFORMERS_OFFLINE="1"
LABEL \
      io.stackpin.attention="sdpa" \
      io.stackpin.cell="cpu-bookworm-torch2130-py311" \
      io.stackpin.cell-json="{\"arch\":[],\"attention\":null,\"base\":{\"bootstrap\":{\"mirror\":\"http://deb.debian.org/debian\",\"mmdebstrap_variant\":\"minbase\",\"packages\":[\"python3\",\"python3-venv\",\"ca-certificates\"],\"suite\":\"bookworm\"},\"digest\":\"\",\"image\":\"\"},\"bitsandbytes\":\"disabled\",\"cpu_arch\":\"x86_64\",\"description\":\"CPU reference: proves the pipeline (build, verify, bundle, rebuild) on any host\",\"env\":{\"HF_HUB_OFFLINE\":\"1\",\"OMP_NUM_THREADS\":\"2\",\"TRANSFORMERS_OFFLINE\":\"1\"},\"env_script\":\"\",\"glibc\":\"2.36\",\"id\":\"cpu-bookworm-torch2130-py311\",\"numpy\":\"<2\",\"platform\":\"cpu\",\"platform_version\":\"\",\"python\":\"cp311\",\"run\":{\"cap_add\":[],\"devices\":[],\"gpus\":\"\",\"group_add\":[],\"ipc\":\"\",\"security_opt\":[],\"shm_size\":\"\",\"volumes\":[]},\"source_date_epoch\":1735689600,\"stack\":{\"accelerate\":\"1.15.0\",\"datasets\":\"5.2.0\",\"numpy\":\"1.26.4\",\"peft\":\"0.21.0\",\"safetensors\":\"0.8.0\",\"transformers\":\"5.17.0\",\"trl\":\"1.16.0\"},\"torch\":{\"filename\":\"torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl\",\"sha256\":\"6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b\",\"source\":\"index\"},\"variants\":[\"stable\"],\"vendor_wheels\":[]}" \
      io.stackpin.lock-digest="98e3c03928e3d5d579f30aebd3a423e1dc758a6c5f42f1d0526e3a19bed049c7" \
      io.stackpin.platform="cpu" \
      io.stackpin.source-date-epoch="1735689600" \
      io.stackpin.variant="stable" \
      io.stackpin.version="0.1.0" \
      org.opencontainers.image.base.name="stackpin/base-bookworm:eff575722d7d" \
      org.opencontainers.image.created="2025-01-01T00:00:00Z" \
      org.opencontainers.image.description="CPU reference: proves the pipeline (build, verify, bundle, rebuild) on any host" \
      org.opencontainers.image.title="stackpin/cpu-bookworm-torch2130-py311" \
      org.opencontainers.image.vendor="stackpin" \
      org.opencontainers.image.version="stable-98e3c03928e3"
ENTRYPOINT ["/opt/stackpin/entrypoint.sh"]
CMD ["python", "-m", "stackpin_verify", "--levels", "0"]
