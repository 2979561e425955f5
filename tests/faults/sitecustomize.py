"""Kernel faults injected into a real run of ``python -m stackpin_verify``.

Put this folder first on PYTHONPATH and name the fault in STACKPIN_FAULT; Python imports
this module at start-up, before the suite, and replaces the kernel entry points the suite
calls. The unit tests run it on CPU; docs/evidence/h200-faults ran it on an H200.

- ``matmul_no_kernel_image``: every matmul raises CUDA's wrong-architecture error.
- ``sdpa_no_kernel_image``: SDPA raises it.
- ``sdpa_noise`` / ``flash_noise``: the output carries ~3 % relative noise.
- ``sdpa_causal_ignored`` / ``flash_causal_ignored``: the causal flag is dropped.
- ``torch_import_sigbus``: importing torch kills the process with SIGBUS, as a truncated
  extension module does (the suite's own process must survive to report it).
"""

from __future__ import annotations

import functools
import os
from typing import Any

FAULT = os.environ.get("STACKPIN_FAULT", "")
NO_KERNEL_IMAGE = "CUDA error: no kernel image is available for execution on the device"
NOISE = 0.03


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(NO_KERNEL_IMAGE)


def _noisy(fn: Any) -> Any:
    import torch

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        gen = torch.Generator(device="cpu").manual_seed(1)
        noise = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
        return out + NOISE * out.detach().abs() * noise

    return wrapper


def _acausal(fn: Any, flag: str) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs[flag] = False
        return fn(*args, **kwargs)

    return wrapper


def _inject(fault: str) -> None:
    import torch
    import torch.nn.functional as F

    if fault == "matmul_no_kernel_image":
        torch.Tensor.__matmul__ = _raise  # type: ignore[method-assign,assignment]
        torch.matmul = _raise
    elif fault == "sdpa_no_kernel_image":
        F.scaled_dot_product_attention = _raise
    elif fault == "sdpa_noise":
        F.scaled_dot_product_attention = _noisy(F.scaled_dot_product_attention)
    elif fault == "sdpa_causal_ignored":
        F.scaled_dot_product_attention = _acausal(F.scaled_dot_product_attention, "is_causal")
    elif fault in ("flash_noise", "flash_causal_ignored"):
        import flash_attn

        wrap = _noisy if fault == "flash_noise" else functools.partial(_acausal, flag="causal")
        flash_attn.flash_attn_func = wrap(flash_attn.flash_attn_func)
        flash_attn.flash_attn_varlen_func = wrap(flash_attn.flash_attn_varlen_func)
    else:
        msg = f"unknown STACKPIN_FAULT {fault!r}"
        raise SystemExit(msg)


class _DieOnTorch:
    """A meta-path finder: the import of torch kills the importing process."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch":
            import signal

            os.kill(os.getpid(), signal.SIGBUS)


if FAULT == "torch_import_sigbus":
    import sys

    sys.meta_path.insert(0, _DieOnTorch())
elif FAULT:
    _inject(FAULT)
