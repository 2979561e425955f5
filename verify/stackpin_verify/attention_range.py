"""L3 at the top of each dtype's range (issue 22).

Unit-variance inputs keep every scaled logit near 6: a kernel that computes bf16 inputs in
fp16 inside passes those, its error even shrinks, and overflows on the first large
activation. Two cases per dtype, forward only, judged against the explicit attention in
float32 (float64 for fp32) with the bound of attention.compare_attention (twice the same
explicit attention in the dtype), after a check that every output is finite:

- ``range.values``: q elements far above fp16's 65,504 for bf16 and fp32 (2^64), k that
  small (2^-63) so the logits stay of order 1 and the softmax spread, v near the top of the
  range (2^120; fp16: q 2^7, k 2^-6, v 2^13, under its 65,504).
- ``range.logits``: logits themselves beyond fp16's range for bf16 (std 2^20), near
  the top of what fp16's explicit QK^T can hold (2^10), 2^100 for fp32.

The gradients are not judged here: dP = dO V^T at these magnitudes leaves fp16 in the
explicit reference itself; the unit-variance cases judge them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

from stackpin_verify.attention import FACTOR, judge_errors, tensor_error
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, run_check
from stackpin_verify.context import DTYPES, Context
from stackpin_verify.masked import masked_math
from stackpin_verify.torchnames import CPU

# Query, key and value scales as powers of two (exact in every dtype), per dtype and case.
VALUE_SCALES = {"fp32": (64, -63, 120), "bf16": (64, -63, 120), "fp16": (7, -6, 13)}
# Standard deviation of the scaled logits (q and k each the square root of it times d^1/4).
LOGIT_SCALES = {"fp32": 100, "bf16": 20, "fp16": 10}
SHAPE = (2, 4, 113, 64)  # [B, H, S, D]

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def range_inputs(
    dtype_name: str, case: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q, k, v [B, H, S, D] at the case's scales, rounded to the dtype."""
    gen = torch.Generator(device=CPU).manual_seed(11)
    q, k, v = (torch.randn(SHAPE, generator=gen, dtype=torch.float64) for _ in range(3))
    if case == "values":
        eq, ek, ev = VALUE_SCALES[dtype_name]
        q, k, v = q * 2.0**eq, k * 2.0**ek, v * 2.0**ev
    else:
        # q.k / sqrt(d) has std |q| |k| for unit-variance entries; split the scale evenly.
        half = 2.0 ** (LOGIT_SCALES[dtype_name] / 2)
        q, k = q * half, k * half
    dtype = DTYPES[dtype_name]
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


def max_logit(q: torch.Tensor, k: torch.Tensor) -> float:
    return float((q @ k.transpose(-2, -1)).abs().max()) / math.sqrt(q.shape[-1])


def judge_finite(out: torch.Tensor) -> str | None:
    bad = int((~torch.isfinite(out.detach())).sum())
    if bad:
        return f"{bad} of {out.numel()} outputs are not finite (inf or NaN)"
    return None


def compare_forward(
    fn: AttnFn, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[Metrics, str | None]:
    """``fn``'s output against the explicit attention in float32 (float64 for fp32
    inputs), bounded by twice the explicit attention's own error in the inputs' dtype."""
    wide = torch.float64 if inputs[0].dtype == torch.float32 else torch.float32
    with torch.no_grad():
        reference = masked_math(*(t.to(wide) for t in inputs), causal=False)
        pytorch = masked_math(*inputs, causal=False)
        out = fn(*inputs)
    metrics: Metrics = {
        "dtype": str(inputs[0].dtype).removeprefix("torch."),
        "reference_dtype": str(wide).removeprefix("torch."),
        "max_abs_q": float(inputs[0].abs().max()),
        "max_abs_v": float(inputs[2].abs().max()),
        "max_abs_logit": max_logit(inputs[0].to(wide), inputs[1].to(wide)),
    }
    reason = judge_finite(out)
    if reason:
        return metrics, reason
    if out.shape != reference.shape:
        return metrics, f"output shape {list(out.shape)} != expected {list(reference.shape)}"
    error = tensor_error(out, pytorch, reference, factor=FACTOR)
    metrics["errors"] = {"out": error.to_json()}
    return metrics, judge_errors({"out": error})


def range_names(kernel: str, dtypes: Sequence[str]) -> list[tuple[str, str, str]]:
    """(check name, dtype, case) for every dtype and both cases."""
    return [
        (f"L3.{kernel}.{dtype}.range.{case}", dtype, case)
        for dtype in dtypes
        for case in ("values", "logits")
    ]


def run(
    ctx: Context,
    kernel: str,
    dtypes: Sequence[str],
    fn: AttnFn,
    unsupported: Callable[[str], str | None],
) -> list[CheckResult]:
    """``fn`` takes [B, H, S, D]; ``unsupported(dtype)`` says why a dtype skips."""
    return [
        run_check(name, functools.partial(check_range, ctx, fn, dtype, case, unsupported))
        for name, dtype, case in range_names(kernel, dtypes)
    ]


def check_range(
    ctx: Context,
    fn: AttnFn,
    dtype_name: str,
    case: str,
    unsupported: Callable[[str], str | None],
) -> Metrics:
    why = unsupported(dtype_name)
    if why:
        raise Skip(why)
    inputs = range_inputs(dtype_name, case, ctx.device)
    try:
        metrics, reason = compare_forward(fn, inputs)
    except Exception as exc:
        msg = f"attention at the top of the {dtype_name} range raised {type(exc).__name__}: {exc}"
        raise CheckFailed(msg) from exc
    if reason:
        msg = f"{case} near the top of the {dtype_name} range: {reason}"
        raise CheckFailed(msg, metrics)
    return metrics


def flash_bhsd(flash_func: Callable[..., torch.Tensor]) -> AttnFn:
    """flash_attn_func (on [B, S, H, D]) as an AttnFn on [B, H, S, D]."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = flash_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False)
        return out.transpose(1, 2)

    return fn
