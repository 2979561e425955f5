"""AMD GPUs with ROCm (HIP): torch from the PyTorch ROCm index, labelled ``+rocm6.4``.

HIP builds keep the torch.cuda API but report their backend as rocm; HIP reads
HIP_VISIBLE_DEVICES; /dev/kfd and /dev/dri; like DTK, a stop waits for /dev/kfd.
"""

from __future__ import annotations

from stackpin.platforms.spec import (
    HIP_NODE_PROBES,
    PlatformSpec,
    RunDefaults,
    TokenPattern,
    TorchRule,
    TreeFacts,
    WheelLabel,
)

SPEC = PlatformSpec(
    name="rocm",
    title="ROCm",
    description="AMD GPUs with ROCm (HIP)",
    version_example="6.4",
    label=WheelLabel(
        tokens=(TokenPattern(kind="rocm", pattern=r"rocm(?P<v>\d{1,2}(?:\.\d{1,2}){1,2})(?!\d)"),),
        rank=1,
        version_token="rocm",
        vendor="rocm",
    ),
    torch=TorchRule(
        expected="torch built for ROCm {version} (+rocm{version})",
        fix="pin torch from the PyTorch index for ROCm {version}",
        names_version=True,
        vendors=("rocm",),
    ),
    serves_product=True,
    visibility_env="HIP_VISIBLE_DEVICES",
    device_hint="/dev/kfd, /dev/dri (and /dev/mkfd)",
    run_defaults=RunDefaults(devices=("/dev/kfd", "/dev/dri"), group_add=("video",),
                             shm_size="16g"),
    backend="rocm",
    collective="nccl",  # RCCL underneath
    probes=(
        *HIP_NODE_PROBES,
    ),
    release_node="/dev/kfd",
    one_profile_per_card=True,
    vendor_tree=TreeFacts(
        product="ROCm", root="/opt/rocm-{version}-rehearsal", link="/opt/rocm",
        path=("/opt/rocm/bin", "/opt/rocm/llvm/bin"),
        tools=(("/opt/rocm/bin/rocm-smi", "rocm-smi, ROCm's device monitor"),),
        hip_library="libamdhip64.so",
    ),
)
