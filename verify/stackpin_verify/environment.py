"""Facts about the host and the Python stack: cgroup limits, backend, versions, devices.

Containers see the host's CPUs and memory in ``lscpu``/``free`` but are limited by their
cgroup (field report: 128 threads visible, 15 usable), so limits come from the cgroup files.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any

from stackpin_verify.torchnames import BACKEND_CPU, BACKEND_CUDA, BACKEND_HIP

CGROUP_ROOT = Path("/sys/fs/cgroup")

# cgroup v1 reports "no limit" as a page-aligned huge number rather than "max".
_V1_UNLIMITED = 1 << 62

# Distributions whose versions the report records when installed (metadata only: importing
# unsloth would patch transformers as a side effect).
OPTIONAL_DISTS = (
    "numpy",
    "triton",
    "transformers",
    "tokenizers",
    "peft",
    "trl",
    "accelerate",
    "datasets",
    "unsloth",
    "flash_attn",
    "flash-attn-4",
    "bitsandbytes",
)


def cgroup_cpus(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the cgroup allows (quota / period), or None when unlimited or unknown."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        if quota == "max" or not period:
            return None
        return int(quota) / int(period)
    quota_v1 = _read(root / "cpu" / "cpu.cfs_quota_us")
    period_v1 = _read(root / "cpu" / "cpu.cfs_period_us")
    if quota_v1 is None or period_v1 is None or int(quota_v1) <= 0:
        return None
    return int(quota_v1) / int(period_v1)


def cgroup_memory_bytes(root: Path = CGROUP_ROOT) -> int | None:
    """Memory limit of the cgroup in bytes, or None when unlimited or unknown."""
    v2 = _read(root / "memory.max")
    if v2 is not None:
        return None if v2 == "max" else int(v2)
    v1 = _read(root / "memory" / "memory.limit_in_bytes")
    if v1 is None or int(v1) >= _V1_UNLIMITED:
        return None
    return int(v1)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def host_info(root: Path = CGROUP_ROOT) -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cgroup_cpus": cgroup_cpus(root),
        "cgroup_memory_bytes": cgroup_memory_bytes(root),
    }


def backend_label(*, hip: str | None, cuda: str | None, device_available: bool) -> str:
    """``rocm`` for any HIP build: it keeps the torch.cuda API, so is_available() says True
    there and a HIP build must never be reported as CUDA (dcu-facts: report honestly)."""
    if hip:
        return BACKEND_HIP
    if cuda and device_available:
        return BACKEND_CUDA
    return BACKEND_CPU


def detect_backend() -> str:
    import torch  # here, not at module level: preflight reports without importing torch

    return backend_label(
        hip=getattr(torch.version, "hip", None),
        cuda=getattr(torch.version, "cuda", None),
        device_available=torch.cuda.is_available(),
    )


def devices() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        found.append({"index": index, "name": props.name, "memory_bytes": props.total_memory})
    return found


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str]:
    import torch

    found = {"python": platform.python_version(), "torch": str(torch.__version__)}
    for dist in OPTIONAL_DISTS:
        version = dist_version(dist)
        if version is not None:
            found[dist] = version
    if getattr(torch.version, "hip", None):
        found["hip"] = str(torch.version.hip)
    if getattr(torch.version, "cuda", None):
        found["cuda"] = str(torch.version.cuda)
    return found


class ImageInfoError(ValueError):
    """image.json exists but cannot be used."""


def load_image_info(path: Path) -> dict[str, Any]:
    """Read and minimally validate the image's description written at build time."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        msg = f"cannot read image info {path}: {exc}"
        raise ImageInfoError(msg) from exc
    if not isinstance(data, dict) or data.get("schema") != 1:
        msg = f"image info {path} is not schema 1 (got schema={_schema_of(data)!r})"
        raise ImageInfoError(msg)
    if not isinstance(data.get("pins", {}), dict):
        msg = f"image info {path}: 'pins' must be an object"
        raise ImageInfoError(msg)
    return data


def _schema_of(data: object) -> object:
    return data.get("schema") if isinstance(data, dict) else type(data).__name__
