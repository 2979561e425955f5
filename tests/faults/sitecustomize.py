"""Kernel faults injected into a real run of ``python -m stackpin_verify``.

Put this folder first on PYTHONPATH and name the fault in STACKPIN_FAULT; Python imports
this module at start-up, before the suite, and replaces the kernel entry points the suite
calls. The unit tests run it on CPU; docs/evidence/h200-faults ran it on an H200.

- ``matmul_no_kernel_image``: every matmul raises CUDA's wrong-architecture error.
- ``sdpa_no_kernel_image``: SDPA raises it.
- ``sdpa_noise`` / ``flash_noise``: the output carries ~3 % relative noise.
- ``sdpa_causal_ignored`` / ``flash_causal_ignored``: the causal flag is dropped.
- ``linear_noise``: every ``F.linear`` (all of a model's projections) carries that noise.
- ``rope_reversed``: transformers' Qwen2 rotates queries and keys the wrong way round.
- ``logits_scaled``: Qwen2's logits come out 5 % larger (the argmax, the tokens, unchanged).
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
LOGIT_SCALE = 1.05


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


def _rope_reversed(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(q, k, cos, -sin, *args, **kwargs)

    return wrapper


def patches(fault: str) -> list[tuple[Any, str, Any]]:
    """(object, attribute, replacement) for each entry point the fault replaces; the unit
    tests apply them with pytest's monkeypatch, a real run at start-up."""
    import torch
    import torch.nn.functional as F

    if fault == "matmul_no_kernel_image":
        return [(torch.Tensor, "__matmul__", _raise), (torch, "matmul", _raise)]
    sdpa = F.scaled_dot_product_attention
    if fault == "sdpa_no_kernel_image":
        return [(F, "scaled_dot_product_attention", _raise)]
    if fault == "sdpa_noise":
        return [(F, "scaled_dot_product_attention", _noisy(sdpa))]
    if fault == "sdpa_causal_ignored":
        return [(F, "scaled_dot_product_attention", _acausal(sdpa, "is_causal"))]
    if fault == "linear_noise":
        return [(F, "linear", _noisy(F.linear))]
    if fault in ("rope_reversed", "logits_scaled"):
        from transformers.models.qwen2 import modeling_qwen2 as qwen2

        if fault == "rope_reversed":
            return [(qwen2, "apply_rotary_pos_emb", _rope_reversed(qwen2.apply_rotary_pos_emb))]
        head = qwen2.Qwen2ForCausalLM.forward
        return [(qwen2.Qwen2ForCausalLM, "forward", _scaled_logits(head))]
    if fault in ("flash_noise", "flash_causal_ignored"):
        import flash_attn

        wrap = _noisy if fault == "flash_noise" else functools.partial(_acausal, flag="causal")
        return [
            (flash_attn, "flash_attn_func", wrap(flash_attn.flash_attn_func)),
            (flash_attn, "flash_attn_varlen_func", wrap(flash_attn.flash_attn_varlen_func)),
        ]
    msg = f"unknown STACKPIN_FAULT {fault!r}"
    raise SystemExit(msg)


def _scaled_logits(forward: Any) -> Any:
    """The model's logits 5 % larger: the argmax (the tokens) unchanged, the logits not."""

    @functools.wraps(forward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = forward(*args, **kwargs)
        out.logits = out.logits * LOGIT_SCALE
        return out

    return wrapper


def _inject(fault: str) -> None:
    for owner, name, replacement in patches(fault):
        setattr(owner, name, replacement)


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
