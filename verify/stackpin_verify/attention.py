"""Attention comparison machinery shared by the SDPA and FlashAttention checks (pure)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from stackpin_verify.checks import Metrics

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    """Explicit softmax(QK^T/sqrt(d) + mask) V on [B, H, S, D]; GQA by repeating K/V heads."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s_q, s_k = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(s_k - s_q)
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def make_qkv(
    shape_q: Sequence[int],
    shape_kv: Sequence[int],
    *,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(*shape_q, generator=gen)
    k = torch.randn(*shape_kv, generator=gen)
    v = torch.randn(*shape_kv, generator=gen)
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


def _forward_backward(
    fn: AttnFn,
    inputs: Sequence[torch.Tensor],
    grad_out: torch.Tensor | None,
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    if grad_out is None:
        return out, []
    if not out.requires_grad:
        return out, [None for _ in leaves]
    torch.autograd.backward(out, grad_tensors=grad_out.to(out.dtype))
    return out, [leaf.grad for leaf in leaves]


def compare_attention(
    fn: AttnFn,
    reference: AttnFn,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    tolerance: float,
    backward: bool = True,
) -> tuple[Metrics, str | None]:
    """Run ``fn`` and ``reference`` forward (and backward with the same upstream gradient)
    on the same rounded inputs; the reference runs in higher precision. Differences are
    absolute on O(1) data, reported per tensor so a reason names what broke."""
    # float64 where it is cheap (CPU); accelerators run the reference in float32.
    wide = torch.float64 if inputs[0].device.type == "cpu" else torch.float32
    ref_inputs = [t.detach().to(wide) for t in inputs]
    with torch.no_grad():
        out_shape = reference(*ref_inputs).shape
    gen = torch.Generator(device="cpu").manual_seed(99)
    grad_out = torch.randn(out_shape, generator=gen, dtype=wide).to(inputs[0].device)
    ref_out, ref_grads = _forward_backward(reference, ref_inputs, grad_out if backward else None)
    out, grads = _forward_backward(fn, inputs, grad_out if backward else None)
    metrics: Metrics = {
        "tolerance": tolerance,
        "shape_q": list(inputs[0].shape),
        "shape_kv": list(inputs[1].shape),
    }
    if out.shape != ref_out.shape:
        return metrics, f"output shape {list(out.shape)} != expected {list(ref_out.shape)}"
    diffs = {"out": _diffs(out, ref_out)}
    names = ("dq", "dk", "dv")
    missing = [name for name, got in zip(names, grads, strict=False) if got is None]
    for name, got, want in zip(names, grads, ref_grads, strict=False):
        if got is not None:
            diffs[name] = _diffs(got, want)
    metrics["max_abs_diff"] = max(raw for raw, _ in diffs.values())
    metrics["max_scaled_diff"] = max(scaled for _, scaled in diffs.values())
    metrics["diffs"] = {name: raw for name, (raw, _) in diffs.items()}
    reason = _judge_diffs(diffs, tolerance)
    if missing:
        # An output without an autograd graph means backward cannot train through it.
        note = f"no gradient path: {', '.join(missing)} not computed"
        reason = f"{reason}; {note}" if reason else f"forward output has {note}"
    return metrics, reason


def _diffs(got: torch.Tensor, want: torch.Tensor | None) -> tuple[float, float]:
    """Absolute and scaled difference. Gradients grow with sequence length and GQA group
    size (a key shared by many queries sums their gradients), so the tolerance applies to
    the difference divided by max(1, max|reference|)."""
    if want is None:
        return float("inf"), float("inf")
    want = want.detach()
    raw = float((got.detach().to(want.dtype) - want).abs().max())
    return raw, raw / max(1.0, float(want.abs().max()))


def _judge_diffs(diffs: dict[str, tuple[float, float]], tolerance: float) -> str | None:
    bad = {name: pair for name, pair in diffs.items() if not pair[1] <= tolerance}
    if not bad:
        return None
    parts = ", ".join(
        f"{name} max_abs_diff {raw:.3g} (scaled {scaled:.3g})"
        for name, (raw, scaled) in bad.items()
    )
    return f"{parts} exceed tolerance {tolerance:g}"
