"""L1 shapes the square, tile-aligned GEMM never reached (issue 22): edges that are no
multiple of any tile, a K long enough to show low-precision accumulation, a batched GEMM.

Each product is judged element by element against float64 on the same rounded inputs,
by the bound rounding theory gives for a kernel that accumulates in float32 and rounds
once to the output dtype:

    |c - c64| <= u_out |c64| + LAMBDA sqrt(K) u_acc (|A| |B|) + reduction

``u_out`` is the output dtype's unit roundoff, ``u_acc`` float32's (TF32's for fp32 where
torch lets matmuls use it), the middle term Higham and Mary's probabilistic bound for a
K-term dot product (2019; it holds with probability >= 1 - 2 exp(-LAMBDA^2 / 2) per element:
1 - 3e-8 at 6). ``reduction`` is room for torch's reduced-precision split-K reductions,
which it allows by default on accelerators for fp16 and bf16. A kernel accumulating in
fp16 errs by about sqrt(K) u_fp16 |partial sums|: 16x the bound at K = 16384.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, run_check
from stackpin_verify.context import DTYPES, Context
from stackpin_verify.torchnames import CPU, GPU

LAMBDA = 6.0
U32 = 2.0**-24
UTF32 = 2.0**-11
# Split-K partial sums reduced in the output dtype: a handful of roundings of |c|'s size.
REDUCTION_ROUNDINGS = 8

# (batch, M, K, N): batch 0 = a plain 2-D product.
CPU_SHAPES = {
    "edges": (0, 257, 131, 67),
    "large_k": (0, 33, 16384, 25),
    "batched": (5, 97, 65, 113),
}
GPU_SHAPES = {
    "edges": (0, 1001, 1531, 777),
    "large_k": (0, 256, 65536, 192),
    "batched": (8, 1001, 511, 777),
}

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


@dataclass(frozen=True)
class Bound:
    u_out: float
    u_acc: float
    reduction: float  # times max|c64|

    def to_json(self) -> dict[str, float]:
        return {"u_out": self.u_out, "u_acc": self.u_acc, "reduction": self.reduction}


def bound_for(dtype: torch.dtype, device: torch.device) -> Bound:
    """The rounding a correct kernel may add, by what torch lets it do here."""
    u_out = unit_roundoff(dtype)
    u_acc = U32
    reduction = 0.0
    if device.type == GPU:
        matmul = torch.backends.cuda.matmul
        if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
            u_acc = UTF32
        reduced = {
            torch.float16: getattr(matmul, "allow_fp16_reduced_precision_reduction", False),
            torch.bfloat16: getattr(matmul, "allow_bf16_reduced_precision_reduction", False),
        }
        if reduced.get(dtype):
            reduction = REDUCTION_ROUNDINGS * u_out
    return Bound(u_out, u_acc, reduction)


def judge_product(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bound: Bound
) -> tuple[Metrics, str | None]:
    """``out`` against float64 on the same inputs, element by element (computed where the
    operands are: the GPU shapes are GFLOPs in float64, seconds on a host CPU)."""
    out64, a64, b64 = (t.detach().to(torch.float64) for t in (out, a, b))
    bad = int((~torch.isfinite(out64)).sum())
    if bad:
        return {"nonfinite": bad}, f"{bad} non-finite values in the product"
    ref = a64 @ b64
    k = a.shape[-1]
    allowed = (
        bound.u_out * ref.abs()
        + LAMBDA * math.sqrt(k) * bound.u_acc * (a64.abs() @ b64.abs())
        + bound.reduction * float(ref.abs().max())
        + torch.finfo(torch.float64).tiny
    )
    ratio = (out64 - ref).abs() / allowed
    worst = float(ratio.max())
    metrics: Metrics = {"k": k, "worst_ratio": worst, "bound": bound.to_json()}
    if not worst <= 1.0:
        flat = int(ratio.argmax())
        where = unravel(flat, tuple(ratio.shape))
        err = float((out64 - ref).abs().flatten()[flat])
        reason = (
            f"error {err:.3g} at {where} is {worst:.4g}x the bound u_out |c| + "
            f"{LAMBDA:g} sqrt(K={k}) u_acc |A||B| (u_out {bound.u_out:.3g}, u_acc "
            f"{bound.u_acc:.3g}): accumulation narrower than float32 or a wrong product"
        )
        return metrics, reason
    return metrics, None


def unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    """A flat index as coordinates (torch.unravel_index is 2.2+; the cells pin 2.1)."""
    coords = []
    for size in reversed(shape):
        coords.append(index % size)
        index //= size
    return coords[::-1]


def operands(
    shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, m, k, n = shape
    lead = (batch,) if batch else ()
    gen = torch.Generator(device=CPU).manual_seed(4321)
    a = torch.randn(*lead, m, k, generator=gen).to(device, dtype)
    b = torch.randn(*lead, k, n, generator=gen).to(device, dtype)
    return a, b


def check_shape(
    ctx: Context,
    dtype_name: str,
    case: str,
    unsupported: Callable[[str], str | None],
    matmul: Matmul | None = None,
) -> Metrics:
    """``matmul`` replaces ``a @ b`` (tests inject a kernel accumulating in fp16)."""
    why = unsupported(dtype_name)
    if why:
        raise Skip(why)
    dtype = DTYPES[dtype_name]
    shape = (GPU_SHAPES if ctx.accelerated else CPU_SHAPES)[case]
    a, b = operands(shape, dtype, ctx.device)
    out = matmul(a, b) if matmul else a @ b
    metrics, reason = judge_product(out, a, b, bound_for(dtype, ctx.device))
    metrics["shape"] = list(shape)
    if reason:
        raise CheckFailed(reason, metrics)
    return metrics


def run(ctx: Context, unsupported: Callable[[str], str | None]) -> list[CheckResult]:
    return [
        run_check(
            f"L1.gemm.{name}.{case}",
            functools.partial(check_shape, ctx, name, case, unsupported),
        )
        for name in ("fp32", "fp16", "bf16")
        for case in CPU_SHAPES
    ]
