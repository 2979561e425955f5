"""What the device can compute, decided by capability queries, never by a kernel's exception.

A kernel built for another architecture raises ``no kernel image is available for execution
on the device`` (CUDA) or ``hipErrorNoBinaryForGpu`` (HIP). If an exception from a tiny probe
meant "unsupported dtype", such a kernel would turn every check into a skip and the suite
into a pass. So on an accelerator a dtype is supported or not by the device's own
description, and once it is supported any exception from a kernel is a failure:

- CUDA: fp32 and fp16 on every device torch runs on; bf16 from compute capability 8.0
  (Ampere), where bf16 arithmetic exists in hardware. ``torch.cuda.is_bf16_supported()``
  is recorded but not used: recent torch answers True on older GPUs through emulation.
- ROCm/HIP (DTK included): fp32 and fp16 everywhere; bf16 on the architectures in
  ``ROCM_BF16_ARCHES`` (the gfx name from ``gcnArchName``). torch's own query answers True
  for every HIP device, so it cannot decide.
- CPU: fp32 always, so an exception there fails. fp16 and bf16 are unsupported only when
  torch's dispatcher says so in its fixed form ``"... not implemented for 'Half'"``; any
  other exception fails.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from typing import Any

import torch

from stackpin_verify.torchnames import CPU, GPU

# gfx90a (MI200), gfx94x/gfx95x (MI300/MI350), gfx11xx/gfx12xx (RDNA3/4), and Hygon's
# gfx928 (K100-AI) and gfx936/gfx938 (BW), where the field ran bf16 training.
ROCM_BF16_ARCHES = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12", "gfx928", "gfx936", "gfx938")
CUDA_BF16_CAPABILITY = (8, 0)
# FlashAttention 2 runs on Ampere and newer (its README: "Ampere, Ada, or Hopper GPUs").
CUDA_FLASH_CAPABILITY = (8, 0)

_DTYPE_NAMES = {"fp32": "Float", "fp16": "Half", "bf16": "BFloat16"}
_NOT_IMPLEMENTED = re.compile(r"not implemented for '(Half|BFloat16)'")


def device_arch(device: torch.device) -> str:
    """``sm_90`` for CUDA, the gfx name (``gfx928``) for HIP, ``cpu`` otherwise."""
    if device.type != GPU:
        return CPU
    props = torch.cuda.get_device_properties(device)
    gcn = getattr(props, "gcnArchName", "")
    if getattr(torch.version, "hip", None) and gcn:
        return str(gcn).split(":", 1)[0]
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def accelerator_unsupported(name: str, arch: str) -> str | None:
    """Why an accelerator of ``arch`` (``sm_90``, ``gfx928``) lacks dtype ``name``, or None."""
    if name in ("fp32", "fp16"):
        return None
    if arch.startswith("sm_"):
        if _sm_capability(arch) >= CUDA_BF16_CAPABILITY:
            return None
        return f"bf16 needs compute capability 8.0 or newer; this device is {arch}"
    if arch.startswith(ROCM_BF16_ARCHES):
        return None
    return f"bf16 is not in the ROCm bf16 architecture table ({', '.join(ROCM_BF16_ARCHES)})"


def _sm_capability(arch: str) -> tuple[int, int]:
    digits = arch.removeprefix("sm_")
    return int(digits[:-1]), int(digits[-1])


def cpu_unsupported(name: str, probe: Callable[[], object]) -> str | None:
    """Run ``probe`` in a lower precision on CPU: None when it works, the dispatcher's
    "not implemented" message when the dtype is missing; any other exception propagates."""
    if name == "fp32":
        return None
    try:
        probe()
    except (RuntimeError, NotImplementedError) as exc:
        found = _NOT_IMPLEMENTED.search(str(exc))
        if found and found.group(1) == _DTYPE_NAMES[name]:
            return f"{name} not implemented on CPU by this torch: {exc}"
        raise
    return None


def unsupported(name: str, device: torch.device, probe: Callable[[], object]) -> str | None:
    """Why ``device`` cannot compute in dtype ``name``, or None. ``probe`` runs on CPU only."""
    if device.type == CPU:
        return cpu_unsupported(name, probe)
    return accelerator_unsupported(name, device_arch(device))


def flash_unsupported(arch: str) -> str | None:
    """Why FlashAttention 2 cannot run on ``arch``, or None (HIP builds are vendor ports
    built for their target list; whether that list holds this arch is what L3 runs)."""
    if arch.startswith("sm_") and _sm_capability(arch) < CUDA_FLASH_CAPABILITY:
        return f"FlashAttention 2 needs compute capability 8.0 or newer; this device is {arch}"
    return None


def triton_target() -> dict[str, Any] | None:
    """Triton's own view of the device: backend, arch, warp size (seed 003 records
    ``GPUTarget(backend='hip', arch='gfx936', warp_size=64)``); None without triton or
    a device."""
    if importlib.util.find_spec("triton") is None or not torch.cuda.is_available():
        return None
    try:
        import triton

        target = triton.runtime.driver.active.get_current_target()
    except Exception as exc:  # a broken triton is L2's finding; the report records why
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "backend": str(target.backend),
        "arch": str(target.arch),
        "warp_size": int(target.warp_size),
    }


def device_report(device: torch.device) -> dict[str, Any]:
    """What the device is, for the report: arch, bf16 by the table above and by torch's own
    query, and the Triton target."""
    arch = device_arch(device)
    facts: dict[str, Any] = {"type": device.type, "arch": arch}
    if device.type == CPU:
        facts["bf16_supported"] = None
        facts["torch_bf16_supported"] = None
    else:
        facts["bf16_supported"] = accelerator_unsupported("bf16", arch) is None
        facts["torch_bf16_supported"] = bool(torch.cuda.is_bf16_supported())
    # Triton's target is the current GPU's: a run judging the CPU on a GPU host has none.
    facts["triton_target"] = None if device.type == CPU else triton_target()
    return facts
