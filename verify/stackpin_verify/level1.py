"""L1 compute: GEMM per dtype, checked against a float64 reference, with throughput."""

from __future__ import annotations

import functools

import torch

from stackpin_verify.checks import CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import DTYPES, Context
from stackpin_verify.timing import median_ms

# Relative to max|reference|. Inputs are rounded to the dtype first and the reference is
# computed from those rounded inputs, so only accumulation and output rounding remain:
# bf16 keeps 8 mantissa bits, fp16 11; fp32 allows TF32 (10 bits) where torch enables it.
TOLERANCE = {"fp32": 1e-3, "fp16": 4e-3, "bf16": 2e-2}


def run(ctx: Context) -> list[CheckResult]:
    return [
        run_check(f"L1.gemm.{name}", functools.partial(check_gemm, ctx, name))
        for name in ("fp32", "fp16", "bf16")
    ]


def gemm_size(device: torch.device) -> int:
    # Large enough to load an accelerator; small enough for 2 CPU cores to finish quickly.
    return 4096 if device.type != "cpu" else 256


def dtype_support(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why this device cannot multiply in ``dtype``, or None when a tiny product works."""
    try:
        a = torch.ones(8, 8, dtype=dtype, device=device)
        out = a @ a
    except (RuntimeError, TypeError) as exc:
        return f"{dtype} matmul unsupported on {device.type}: {exc}"
    if not bool(torch.isfinite(out.float()).all()) or float(out[0, 0]) != 8.0:
        return f"{dtype} matmul on {device.type} gives wrong results for ones(8,8)@ones(8,8)"
    return None


def judge_gemm(
    out: torch.Tensor, ref: torch.Tensor, tolerance: float
) -> tuple[Metrics, str | None]:
    """Compare a product with its float64 reference: finite first, then relative error."""
    out64 = out.to(torch.float64)
    finite = bool(torch.isfinite(out64).all())
    if not finite:
        bad = int((~torch.isfinite(out64)).sum())
        return {"nonfinite": bad}, f"{bad} non-finite values in the product"
    max_abs = float((out64 - ref).abs().max())
    scale = max(float(ref.abs().max()), 1e-30)
    metrics: Metrics = {"max_abs_err": max_abs, "rel_err": max_abs / scale, "tolerance": tolerance}
    if max_abs / scale > tolerance:
        reason = (
            f"relative error {max_abs / scale:.3g} exceeds {tolerance:g} (max abs {max_abs:.3g})"
        )
        return metrics, reason
    return metrics, None


def check_gemm(ctx: Context, name: str) -> Metrics:
    dtype = DTYPES[name]
    unsupported = dtype_support(dtype, ctx.device)
    if unsupported:
        raise Skip(unsupported)
    n = gemm_size(ctx.device)
    gen = torch.Generator(device="cpu").manual_seed(1234)
    a = torch.randn(n, n, generator=gen).to(ctx.device, dtype)
    b = torch.randn(n, n, generator=gen).to(ctx.device, dtype)
    out = a @ b
    metrics, reason = judge_gemm(out, a.double() @ b.double(), TOLERANCE[name])
    metrics["shape"] = [n, n, n]
    require(reason, metrics)
    median, samples = median_ms(lambda: a @ b, ctx.device)
    metrics.update(
        median_ms=median,
        runs=len(samples),
        tflops=2 * n**3 / (median * 1e-3) / 1e12,
        dtype=name,
    )
    return metrics
