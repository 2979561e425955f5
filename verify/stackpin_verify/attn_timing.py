"""L3.variants.attention: the image's attention package (enhanced) against SDPA's default
backend (stable: no backend forced, what a model gets without the package), on the shapes
the cells' service trains and serves at (``stackpin_verify.workload``, declared as data):
forward+backward for training batches, forward for prefills, causal, head dims 64 and 128.

Both kernels get the layout a transformers model hands them: [B, S, H, D] tensors, passed
as they are to the package and as [B, H, S, D] views to SDPA.

What is judged on a device is each call's device time with the host queued ahead
(``bench.queued_timer``), as in a training step, where the host runs ahead of the GPU. One
call timed alone (do_bench) is kept beside it (``*_eager_ms``, ``eager_enhanced_over_stable_*``):
at these sizes it is mostly the host's Python and launches, for SDPA too (H200: 0.47 ms for
0.09 ms of kernels at b4 s512 hd128 fwd+bwd), and FlashAttention 4's host cost per call is
the larger (0.74 ms), so timed alone it reads slower while its kernels are faster.

Correctness is L3's cases' business; here a kernel whose output strays from SDPA's by more
than bf16 can explain (``AGREEMENT``) fails the comparison, so nothing fast and wrong is
ever recommended.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from stackpin_verify import attn_package, capability, recommend, workload
from stackpin_verify.attention import make_qkv, sdpa
from stackpin_verify.bench import Timer, queued_timer, select_timer
from stackpin_verify.checks import CheckFailed, Metrics, Skip
from stackpin_verify.context import Context, synchronize

CHECK = "L3.variants.attention"
MODES = ("fwd", "fwd_bwd")
# Max |package - SDPA| on outputs of order 1: two honest bf16 kernels differ by a few bf16
# ulps (H200, issue 13: under 0.016); a kernel off by this much computes something else.
AGREEMENT = 0.1

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# An attention package's call: [B, S, H, D] tensors and the mask flag.
PackageAttend = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Shape:
    seqlen: int
    head_dim: int
    causal: bool
    mode: str  # "fwd" | "fwd_bwd"
    tokens: int  # batch x seqlen
    heads: int = 16

    @property
    def batch(self) -> int:
        return max(1, self.tokens // self.seqlen)

    @property
    def dims(self) -> list[int]:
        return [self.batch, self.seqlen, self.heads, self.head_dim]

    def describe(self) -> str:
        mask = "causal" if self.causal else "noncausal"
        return f"b{self.batch}.s{self.seqlen}.hd{self.head_dim}.{mask}.{self.mode}"


def shapes() -> list[Shape]:
    """The declared workload's attention calls (workload.json), in its order."""
    return [Shape(s.seqlen, s.head_dim, True, s.mode, tokens=s.batch * s.seqlen,
                  heads=s.heads) for s in workload.attention_shapes()]


def check(ctx: Context) -> Metrics:
    if not ctx.accelerated:
        raise Skip(recommend.NO_DEVICE)
    package = attn_package.for_timing(ctx.image_field("attention"), recommend.NO_PACKAGE)
    dtype = _dtype(ctx.device)
    return compare(package, shapes(), ctx.device, dtype, select_timer(ctx.device),
                   queued_timer(ctx.device))


def _dtype(device: torch.device) -> torch.dtype:
    """bf16, what the cells train in; fp16 where the device has no bf16 arithmetic."""
    bf16 = capability.accelerator_unsupported("bf16", capability.device_arch(device)) is None
    return torch.bfloat16 if bf16 else torch.float16


def compare(
    package: attn_package.AttentionPackage,
    cases: Sequence[Shape],
    device: torch.device,
    dtype: torch.dtype,
    timer: Timer,
    queued: Timer | None = None,
) -> Metrics:
    """Time both kernels on every shape; the metrics carry every number the
    recommendation rests on. Fails when a side raises, disagrees, or the package is slower.
    With ``queued`` (a device) that timer's figures are judged and ``timer``'s (one call
    alone) kept as ``eager``; without, ``timer``'s are judged."""
    rows = [time_shape(shape, package.attend, device, dtype, timer, queued) for shape in cases]
    metrics: Metrics = {
        "package": package.label,
        "timer": (queued or timer).name,
        "dtype": str(dtype).removeprefix("torch."),
        "cases": rows,
    }
    if queued is not None:
        metrics["eager_timer"] = timer.name
    for mode in MODES:
        for prefix, key in (("", "ratio"), ("eager_", "eager_ratio")):
            ratios = [r[key] for r in rows if r["mode"] == mode and key in r]
            if ratios:
                metrics[f"{prefix}enhanced_over_stable_{mode}"] = geomean(ratios)
    require_outcome(metrics, rows)
    return metrics


def require_outcome(metrics: Metrics, rows: Sequence[Metrics]) -> None:
    failed = [r for r in rows if "failed_side" in r]
    if failed:
        sides = sorted({r["failed_side"] for r in failed})
        metrics["failed_side"] = sides[0] if len(sides) == 1 else "both"
        first = failed[0]
        msg = f"{len(failed)} of {len(rows)} shapes failed; {first['shape']}: {first['error']}"
        raise CheckFailed(msg, metrics)
    ratio = metrics.get("enhanced_over_stable_fwd_bwd")
    if ratio is not None and ratio > 1.0 + recommend.TIE_BAND:
        msg = (
            f"enhanced is slower here: {metrics['package']} takes {ratio:.2f}x the time of "
            f"SDPA's default backend forward+backward (geometric mean of "
            f"{sum(r['mode'] == 'fwd_bwd' for r in rows)} shapes)"
        )
        raise CheckFailed(msg, metrics)


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def time_shape(
    shape: Shape,
    package_attend: PackageAttend,
    device: torch.device,
    dtype: torch.dtype,
    timer: Timer,
    queued: Timer | None = None,
) -> Metrics:
    q, k, v = make_qkv(shape.dims, shape.dims, dtype=dtype, device=device)

    def enhanced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return package_attend(q, k, v, causal=shape.causal)

    sides = {"enhanced": enhanced, "stable": _sdpa_bshd(shape.causal)}
    row: Metrics = {"shape": shape.describe(), "dims": shape.dims, "mode": shape.mode}
    row.update(causal=shape.causal, seqlen=shape.seqlen, head_dim=shape.head_dim)
    outputs: dict[str, torch.Tensor] = {}
    for side, attend in sides.items():
        try:
            fn, outputs[side], first_ms = _prepared(attend, (q, k, v), shape, device)
            row[f"{side}_first_call_ms"] = first_ms
            if queued is None:
                row[f"{side}_ms"] = timer.time_ms(fn)
            else:
                row[f"{side}_ms"] = queued.time_ms(fn)
                row[f"{side}_eager_ms"] = timer.time_ms(fn)
        except Exception as exc:
            row["failed_side"] = "both" if "failed_side" in row else side
            error = f"{side}: {type(exc).__name__}: {str(exc)[:300]}"
            row["error"] = f"{row['error']}; {error}" if "error" in row else error
    if "failed_side" in row:
        return row
    diff = float((outputs["enhanced"].float() - outputs["stable"].float()).abs().max())
    row["max_abs_diff"] = diff
    if not diff <= AGREEMENT:  # NaN fails too
        # Blamed on the package, the piece enhanced adds: L3.sdpa's cases judge SDPA itself.
        row.update(failed_side="enhanced", error=f"output differs from SDPA's by {diff:.3g}")
        return row
    row["ratio"] = row["enhanced_ms"] / row["stable_ms"]
    if queued is not None:
        row["eager_ratio"] = row["enhanced_eager_ms"] / row["stable_eager_ms"]
    return row


def _sdpa_bshd(causal: bool) -> Attend:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        views = (t.transpose(1, 2) for t in (q, k, v))
        return sdpa(*views, causal=causal).transpose(1, 2)

    return attend


def _prepared(
    attend: Attend,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    shape: Shape,
    device: torch.device,
) -> tuple[Callable[[], object], torch.Tensor, float]:
    """The function to time, its output, and how long the first call took (FA4 compiles
    its kernels then: timed apart so it never counts as steady-state time)."""
    if shape.mode == "fwd":
        # The inputs do not require grad, so no graph is built.
        forward = functools.partial(attend, *inputs)
        return forward, *_first_call(forward, device)
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(7))
    grad_out = grad.to(device, inputs[0].dtype)

    def step() -> torch.Tensor:
        out = attend(*leaves)
        # autograd.grad, not backward: nothing accumulates between timed calls.
        torch.autograd.grad(out, leaves, grad_out)
        return out

    return step, *_first_call(step, device)


def _first_call(fn: Callable[[], object], device: torch.device) -> tuple[torch.Tensor, float]:
    synchronize(device)
    begin = time.perf_counter()
    out = fn()
    synchronize(device)
    assert isinstance(out, torch.Tensor)
    return out.detach(), (time.perf_counter() - begin) * 1e3
