# Sourced by the GPU-host scripts: NVLink multicast stays off (KINDS.md), output unbuffered.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
