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
- ``sdpa_mask_ignored``: SDPA drops ``attn_mask`` (every padded position is attended).
- ``sdpa_mask_right_aligned``: SDPA reads a padding mask as right padding, counting each
  row's allowed keys from the left (the left-padded batch a chat server sends breaks).
- ``sdpa_narrow_bf16`` / ``flash_narrow_bf16``: bf16 inputs computed in fp16 inside, the
  result cast back (exact at unit scale, inf past fp16's 65,504).
- ``flash_cu_seqlens_k_ignored``: varlen reads the keys with ``cu_seqlens_q``.
- ``flash_causal_top_left``: varlen aligns the causal mask top-left when seqlen_q <
  seqlen_k (flash-attention before 2.1), by cutting each sequence's keys to its queries.
- ``lora_A_frozen``: every lora_A gets a zero gradient (half the adapter's matrices never
  learn; lora_B alone still lowers the loss and memorises).
- ``lora_layer1_frozen``: the adapter of layer 1 gets zero gradients (its lora_B stays 0).
- ``adamw_skips_half``: AdamW is handed every other parameter only.
- ``adapter_saved_stale``: save_pretrained writes the last lora_B as zeros.
- ``matmul_fp16_accumulate``: fp16/bf16 matmuls sum K in chunks of 16 with the running sum
  kept in the input dtype (a kernel whose accumulator is narrower than float32).
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
    if fault == "matmul_fp16_accumulate":
        narrow = _narrow_accumulate(torch.matmul)
        return [(torch, "matmul", narrow), (torch.Tensor, "__matmul__", narrow)]
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
    if fault.startswith("sdpa_"):
        edge = {
            "sdpa_mask_ignored": _mask_ignored,
            "sdpa_mask_right_aligned": _mask_right_aligned,
            "sdpa_narrow_bf16": _narrow_bf16,
        }
        if fault in edge:
            return [(F, "scaled_dot_product_attention", edge[fault](sdpa))]
    if fault in LORA_FAULTS:
        return lora_patches(fault)
    if fault in FLASH_EDGE_FAULTS:
        return flash_edge_patches(fault)
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


ACCUMULATE_CHUNK = 16


def _narrow_accumulate(matmul: Any) -> Any:
    import torch

    @functools.wraps(matmul)
    def wrapper(a: Any, b: Any) -> Any:
        k = a.shape[-1]
        if a.dtype not in (torch.float16, torch.bfloat16) or k <= ACCUMULATE_CHUNK:
            return matmul(a, b)
        total = None
        for start in range(0, k, ACCUMULATE_CHUNK):
            part = matmul(a[..., start : start + ACCUMULATE_CHUNK],
                          b[..., start : start + ACCUMULATE_CHUNK, :])
            total = part if total is None else total + part  # rounded to the input dtype
        return total

    return wrapper


def _mask_ignored(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("attn_mask", None)
        return fn(*args, **kwargs)

    return wrapper


def _mask_right_aligned(fn: Any) -> Any:
    """The mask's count of allowed keys per row, applied as the first that many keys."""
    import torch

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attn_mask")
        if mask is not None:
            allowed = mask if mask.dtype == torch.bool else torch.isfinite(mask)
            count = allowed.sum(-1, keepdim=True)
            position = torch.arange(allowed.shape[-1], device=allowed.device)
            first = position < count
            if mask.dtype != torch.bool:  # an additive mask keeps its values where it reads
                values = torch.where(allowed, mask, torch.zeros_like(mask))
                first = torch.where(first, values, torch.full_like(mask, float("-inf")))
            kwargs["attn_mask"] = first
        return fn(*args, **kwargs)

    return wrapper


def _narrow_bf16(fn: Any) -> Any:
    import torch

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        def narrow(t: Any) -> Any:
            is_bf16 = isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
            return t.to(torch.float16) if is_bf16 else t

        wide = any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args)
        out = fn(*[narrow(a) for a in args], **{k: narrow(v) for k, v in kwargs.items()})
        return out.to(torch.bfloat16) if wide else out

    return wrapper


FLASH_EDGE_FAULTS = ("flash_narrow_bf16", "flash_cu_seqlens_k_ignored", "flash_causal_top_left")


def flash_edge_patches(fault: str) -> list[tuple[Any, str, Any]]:
    import flash_attn

    dense, varlen = flash_attn.flash_attn_func, flash_attn.flash_attn_varlen_func
    if fault == "flash_narrow_bf16":
        return [
            (flash_attn, "flash_attn_func", _narrow_bf16(dense)),
            (flash_attn, "flash_attn_varlen_func", _narrow_bf16(varlen)),
        ]
    wrap = _cu_k_ignored if fault == "flash_cu_seqlens_k_ignored" else _causal_top_left
    return [(flash_attn, "flash_attn_varlen_func", wrap(varlen))]


_VARLEN_OFFSETS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def _varlen_rewrite(fn: Any, rewrite: Any) -> Any:
    """A varlen entry point whose offsets ``rewrite(q, k, v, offsets, kwargs)`` changes,
    called back the way it was called: FlashAttention 2 takes the offsets by position,
    the suite (flashpkg) passes them by keyword because FlashAttention 4 takes ``qv``
    fourth. A wrapper taking only one style would fail the check with its own TypeError,
    not with the fault it stands for."""

    @functools.wraps(fn)
    def wrapper(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
        positional = len(args) >= len(_VARLEN_OFFSETS)
        if positional:
            offsets = dict(zip(_VARLEN_OFFSETS, args, strict=False))
            args = args[len(_VARLEN_OFFSETS):]
        else:
            offsets = {name: kwargs.pop(name) for name in _VARLEN_OFFSETS}
        q, k, v, offsets = rewrite(q, k, v, offsets, kwargs)
        if positional:
            return fn(q, k, v, *(offsets[n] for n in _VARLEN_OFFSETS), *args, **kwargs)
        return fn(q, k, v, *args, **offsets, **kwargs)

    return wrapper


def _cu_k_ignored(fn: Any) -> Any:
    def rewrite(q: Any, k: Any, v: Any, offsets: dict[str, Any], kwargs: Any) -> Any:
        keys_as_queries = dict(offsets, cu_seqlens_k=offsets["cu_seqlens_q"],
                               max_seqlen_k=offsets["max_seqlen_q"])
        return q, k, v, keys_as_queries

    return _varlen_rewrite(fn, rewrite)


def _causal_top_left(fn: Any) -> Any:
    """Each sequence's keys cut to its first seqlen_q: bottom-right of the cut is top-left
    of the whole (where a sequence has more queries than keys, it is left alone)."""
    import torch

    def rewrite(q: Any, k: Any, v: Any, offsets: dict[str, Any], kwargs: Any) -> Any:
        if not kwargs.get("causal"):
            return q, k, v, offsets
        cu_q, cu_k = offsets["cu_seqlens_q"], offsets["cu_seqlens_k"]
        starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
        keep = []
        for i in range(len(starts_q) - 1):
            n_q = starts_q[i + 1] - starts_q[i]
            n_k = starts_k[i + 1] - starts_k[i]
            keep.append(torch.arange(starts_k[i], starts_k[i] + min(n_q, n_k)))
        index = torch.cat(keep).to(k.device)
        cut = torch.tensor([0, *torch.tensor([len(x) for x in keep]).cumsum(0).tolist()],
                           dtype=cu_k.dtype, device=cu_k.device)
        cut_offsets = dict(offsets, cu_seqlens_k=cut, max_seqlen_k=offsets["max_seqlen_q"])
        return q, k[index], v[index], cut_offsets

    return _varlen_rewrite(fn, rewrite)


LORA_FAULTS = ("lora_A_frozen", "lora_layer1_frozen", "adamw_skips_half", "adapter_saved_stale")


def lora_patches(fault: str) -> list[tuple[Any, str, Any]]:
    import peft
    import torch

    if fault == "adamw_skips_half":
        return [(torch.optim, "AdamW", _half_adamw(torch.optim.AdamW))]
    if fault == "adapter_saved_stale":
        return [(peft.PeftModel, "save_pretrained", _stale_save(peft.PeftModel.save_pretrained))]
    part = ".lora_A." if fault == "lora_A_frozen" else ".layers.1."
    return [(peft, "get_peft_model", _frozen(peft.get_peft_model, part))]


def _frozen(get_peft_model: Any, part: str) -> Any:
    import torch

    @functools.wraps(get_peft_model)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        model = get_peft_model(*args, **kwargs)
        for name, param in model.named_parameters():
            if "lora_" in name and part in name:
                param.register_hook(torch.zeros_like)
        return model

    return wrapper


def _half_adamw(adamw: Any) -> Any:
    class HalfAdamW(adamw):  # type: ignore[misc, valid-type]
        def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(list(params)[::2], *args, **kwargs)

    return HalfAdamW


def _stale_save(save: Any) -> Any:
    import torch

    @functools.wraps(save)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        last = [p for n, p in self.named_parameters() if ".lora_B." in n][-1]
        kept = last.detach().clone()
        with torch.no_grad():
            last.zero_()
        try:
            return save(self, *args, **kwargs)
        finally:
            with torch.no_grad():
                last.copy_(kept)

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
