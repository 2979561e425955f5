"""NVIDIA GPUs with CUDA: torch from the public index (``+cu130``, or no label on PyPI).

CUDA_VISIBLE_DEVICES chooses cards; devices come through the NVIDIA container runtime
(``--gpus``), which preflight looks for.
"""

from __future__ import annotations

from stackpin.platforms.spec import (
    PlatformSpec,
    Probe,
    RunDefaults,
    TokenPattern,
    TorchRule,
    WheelLabel,
)


def cuda_version(raw: str) -> str:
    """``12`` -> 12 (major only, as upstream FlashAttention writes it), ``128`` -> 12.8."""
    return raw if len(raw) == 2 else f"{raw[:2]}.{raw[2:]}"


SPEC = PlatformSpec(
    name="cuda",
    title="CUDA",
    description="NVIDIA GPUs with CUDA",
    version_example="12.8",
    label=WheelLabel(
        tokens=(TokenPattern(kind="cuda", pattern=r"cu(?P<v>\d{2,3})(?!\d)"),),
        rank=2,
        version_token="cuda",
        version_of=cuda_version,
        vendor="cuda",
    ),
    torch=TorchRule(
        expected="a CUDA torch (+cuXXX or no label)",
        fix="pin a CUDA build of torch from the public index",
        vendors=("", "cuda"),
        forbids=("cpu",),
    ),
    visibility_env="CUDA_VISIBLE_DEVICES",
    device_hint="--gpus",
    run_defaults=RunDefaults(gpus="all", shm_size="16g"),
    backend="cuda",
    collective="nccl",
    probes=(
        Probe(kind="runtime", target="nvidia", passed="cuda: NVIDIA container runtime present",
              failed="cuda: no NVIDIA container runtime (install nvidia-container-toolkit)",
              podman_cdi="cuda: a CDI spec is present, but the profiles pass Docker's --gpus, "
                         "which Podman 4.x lacks: run CUDA profiles with Docker",
              podman_no_cdi="cuda: no CDI spec for Podman (nvidia-ctk cdi generate), and the "
                            "profiles pass Docker's --gpus: run CUDA profiles with Docker"),
    ),
    one_profile_per_card=True,
)
