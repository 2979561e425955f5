# Rendered by stackpin 0.1.0 for cell dtk2604-bw-torch2100-py310, variant stable.
# Do not edit: change pinning/*.toml and run `stackpin render dtk2604-bw-torch2100-py310 --variant stable`.
# Lock: none yet (run `stackpin wheels fetch`); a build refuses an unlocked cell

# ---- install stage: wheels in, nothing out but /opt/stackpin ------------------------
FROM image.sourcefind.cn:5000/dcu/admin/base/pytorch:2.10.0-ubuntu22.04-dtk26.04-py3.10 AS install
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# No index, no cache, no bytecode from imports: the install stage reads the locked
# wheelhouse only, and bytecode is compiled once, deterministically, after the guard.
ENV PIP_NO_INDEX=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SOURCE_DATE_EPOCH=1767225600
RUN source /opt/dtk/env.sh && python3 -m venv /opt/stackpin/venv

# Layer 1: ABI-bound wheels (torch and vendor builds), --no-deps.
# --no-deps so pip can never replace the vendor torch with a generic one from an index.
COPY wheels/vendor/ /tmp/wheelhouse/vendor/
RUN source /opt/dtk/env.sh && /opt/stackpin/venv/bin/pip install --no-index --no-deps --require-hashes --no-compile \
        --find-links /tmp/wheelhouse/vendor -r /tmp/wheelhouse/vendor/requirements.txt \
    && rm -rf /tmp/wheelhouse/vendor

# Layer 2: the rest of the stack, every transitive wheel locked by sha256.
# Changing one stack pin rebuilds from here; the torch layer above stays cached.
COPY wheels/stack/ /tmp/wheelhouse/stack/
RUN source /opt/dtk/env.sh && /opt/stackpin/venv/bin/pip install --no-index --no-deps --require-hashes --no-compile \
        --find-links /tmp/wheelhouse/stack -r /tmp/wheelhouse/stack/requirements.txt \
    && rm -rf /tmp/wheelhouse/stack

# Guard: the build fails here, not at the site, when pip installed anything but the pins.
COPY stackpin/ /opt/stackpin/
RUN source /opt/dtk/env.sh && /opt/stackpin/venv/bin/pip check \
    && /opt/stackpin/venv/bin/python /opt/stackpin/guard.py \
        --python cp310 --torch 2.10.0+das.opt1.dtk2604 --numpy '<2' \
        --compile /opt/stackpin/venv/lib \
    && rm -rf /root/.cache /tmp/*

# ---- final stage: the base plus the finished environment, no wheel or cache ---------
FROM image.sourcefind.cn:5000/dcu/admin/base/pytorch:2.10.0-ubuntu22.04-dtk26.04-py3.10
COPY --from=install /opt/stackpin /opt/stackpin
COPY verify/ /opt/stackpin/verify/
ENV PATH=/opt/stackpin/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/stackpin/venv \
    PYTHONPATH=/opt/stackpin/verify \
    STACKPIN_ATTENTION=sdpa \
    HF_HUB_OFFLINE="1" \
    TRITON_HIP_LLD_PATH="/opt/dtk/llvm/bin/ld.lld" \
    UNSLOTH_DISABLE_BITSANDBYTES="1"
LABEL \
      io.stackpin.attention="sdpa" \
      io.stackpin.cell="dtk2604-bw-torch2100-py310" \
      io.stackpin.cell-json="{\"arch\":[\"gfx936\"],\"attention\":{\"filename\":\"flash_attn-2.8.3+das.opt1.dtk2604.torch2100-cp310-cp310-manylinux_2_28_x86_64.whl\",\"sha256\":\"\",\"source\":\"vendor\"},\"base\":{\"bootstrap\":null,\"digest\":\"\",\"image\":\"image.sourcefind.cn:5000/dcu/admin/base/pytorch:2.10.0-ubuntu22.04-dtk26.04-py3.10\"},\"bitsandbytes\":\"disabled\",\"cpu_arch\":\"x86_64\",\"description\":\"BW 64 GB: vendor torch 2.10.0, triton 3.5.0, FlashAttention 2.8.3, vLLM 0.18.1\",\"env\":{\"HF_HUB_OFFLINE\":\"1\",\"TRITON_HIP_LLD_PATH\":\"/opt/dtk/llvm/bin/ld.lld\",\"UNSLOTH_DISABLE_BITSANDBYTES\":\"1\"},\"env_script\":\"/opt/dtk/env.sh\",\"glibc\":\"2.35\",\"id\":\"dtk2604-bw-torch2100-py310\",\"numpy\":\"<2\",\"platform\":\"dtk\",\"platform_version\":\"26.04\",\"python\":\"cp310\",\"run\":{\"cap_add\":[],\"devices\":[\"/dev/kfd\",\"/dev/dri\"],\"gpus\":\"\",\"group_add\":[\"video\"],\"ipc\":\"\",\"security_opt\":[],\"shm_size\":\"32g\",\"volumes\":[\"/opt/hyhal:/opt/hyhal:ro\"]},\"source_date_epoch\":1767225600,\"stack\":{\"accelerate\":\"1.10.1\",\"datasets\":\"4.1.1\",\"numpy\":\"1.26.4\",\"peft\":\"0.17.1\",\"safetensors\":\"0.6.2\",\"transformers\":\"4.57.6\",\"trl\":\"0.23.1\",\"unsloth\":\"2025.10.12\"},\"torch\":{\"filename\":\"torch-2.10.0+das.opt1.dtk2604-cp310-cp310-manylinux_2_28_x86_64.whl\",\"sha256\":\"\",\"source\":\"vendor\"},\"variants\":[\"stable\",\"enhanced\"],\"vendor_wheels\":[{\"filename\":\"triton-3.5.0+das.opt1.dtk2604.torch2100-cp310-cp310-manylinux_2_28_x86_64.whl\",\"sha256\":\"\",\"source\":\"vendor\"},{\"filename\":\"vllm-0.18.1+das.opt1.dtk2604.torch2100-cp310-cp310-manylinux_2_28_x86_64.whl\",\"sha256\":\"\",\"source\":\"vendor\"}]}" \
      io.stackpin.lock-digest="unlocked" \
      io.stackpin.platform="dtk" \
      io.stackpin.source-date-epoch="1767225600" \
      io.stackpin.variant="stable" \
      io.stackpin.version="0.1.0" \
      org.opencontainers.image.base.name="image.sourcefind.cn:5000/dcu/admin/base/pytorch:2.10.0-ubuntu22.04-dtk26.04-py3.10" \
      org.opencontainers.image.created="2026-01-01T00:00:00Z" \
      org.opencontainers.image.description="BW 64 GB: vendor torch 2.10.0, triton 3.5.0, FlashAttention 2.8.3, vLLM 0.18.1" \
      org.opencontainers.image.title="stackpin/dtk2604-bw-torch2100-py310" \
      org.opencontainers.image.vendor="stackpin" \
      org.opencontainers.image.version="stable-unlocked"
ENTRYPOINT ["/opt/stackpin/entrypoint.sh"]
CMD ["python", "-m", "stackpin_verify", "--levels", "0"]
