"""What every level needs to know about this run, built once by the runner."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from stackpin_verify.boundary import canonical_name
from stackpin_verify.checks import CheckFailed, Skip
from stackpin_verify.torchnames import CPU, GPU

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Context:
    backend: str
    device: torch.device
    image: dict[str, Any] | None
    dtype_choice: str = "auto"
    # Why image.json could not be used, reported by L0.image_info.
    image_error: str | None = None
    # Results shared between levels (the trained LoRA model feeds L6).
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def accelerated(self) -> bool:
        return self.device.type != CPU

    @property
    def pins(self) -> dict[str, str]:
        pins = (self.image or {}).get("pins") or {}
        return {str(k): str(v) for k, v in pins.items()}

    def image_field(self, key: str) -> str:
        return str((self.image or {}).get(key) or "")

    @property
    def platform_facts(self) -> dict[str, Any]:
        """What the image's platform expects (image.json ``platform_facts``: backend,
        accelerator, collective, device_hint, hip_lld_required); {} outside an image."""
        facts = (self.image or {}).get("platform_facts") or {}
        return dict(facts) if isinstance(facts, dict) else {}

    def train_dtype(self) -> torch.dtype:
        """bf16 on accelerators (the field's stable choice: fp16 NaN'd where bf16 did not),
        fp32 on CPU where bf16 training is slow and not what images ship for."""
        if self.dtype_choice != "auto":
            return DTYPES[self.dtype_choice]
        return torch.bfloat16 if self.accelerated else torch.float32

    def declares(self, dist: str) -> bool:
        """Whether the image pins this distribution, so its absence is a fault."""
        wanted = canonical_name(dist)
        return any(canonical_name(name) == wanted for name in self.pins)

    def need_module(self, name: str, *, dist: str | None = None) -> ModuleType:
        """Import an optional piece: skip when the image does not ship it, fail when it
        claims to and the import breaks (importable is the least it must be)."""
        dist = dist or name
        if importlib.util.find_spec(name) is None:
            if self.declares(dist):
                msg = f"{dist} is pinned in the image but not installed"
                raise CheckFailed(msg)
            msg = f"{dist} is not installed"
            raise Skip(msg)
        try:
            return importlib.import_module(name)
        except Exception as exc:
            msg = f"{dist} is installed but fails to import: {type(exc).__name__}: {exc}"
            raise CheckFailed(msg) from exc


def synchronize(device: torch.device) -> None:
    if device.type == GPU:
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def tiny_work_threads(device: torch.device) -> Iterator[None]:
    """One intra-op thread for tiny CPU workloads (the L3/L5/L6 models): thread hand-off
    costs more than their math, and on a shared 2-core host 80 LoRA steps took 28.8 s with
    2 threads against 3.5 s with 1. Results are identical; GEMM throughput keeps all."""
    if device.type != CPU:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
