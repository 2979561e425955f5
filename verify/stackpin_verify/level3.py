"""L3 attention: SDPA against explicit math; FlashAttention against SDPA where shipped."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import torch
import torch.nn.functional as F

from stackpin_verify.attention import AttnFn, compare_attention, make_qkv, math_attention, sdpa
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import DTYPES, Context, tiny_work_threads
from stackpin_verify.timing import median_ms

# On max|difference| / max(1, max|reference|) per tensor (out, dq, dk, dv), unit-normal
# inputs. bf16 keeps 8 mantissa bits (relative rounding 4e-3 per op), fp16 11.
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 4e-2}
HEAD_DIMS = (64, 128)
# The field's measured FlashAttention case (dcu-facts): [2, 1024, 16, 64] bf16 forward.
SPEEDUP_SHAPE = (2, 1024, 16, 64)


def run(ctx: Context) -> list[CheckResult]:
    with tiny_work_threads(ctx.device):
        return _run(ctx)


def _run(ctx: Context) -> list[CheckResult]:
    results = []
    for name in sdpa_dtypes(ctx):
        for gqa in (False, True):
            for causal in (True, False):
                check_name = f"L3.sdpa.{name}{'.gqa' if gqa else ''}.{_causal(causal)}"
                fn = functools.partial(check_sdpa, ctx, name, gqa=gqa, causal=causal)
                results.append(run_check(check_name, fn))
    results.extend(run_flash(ctx))
    return results


def _causal(causal: bool) -> str:
    return "causal" if causal else "noncausal"


def sdpa_support(dtype: torch.dtype, device: torch.device) -> str | None:
    try:
        q = torch.ones(1, 1, 4, 8, dtype=dtype, device=device, requires_grad=True)
        torch.autograd.backward(F.scaled_dot_product_attention(q, q, q, is_causal=True).sum())
    except (RuntimeError, TypeError) as exc:
        return f"SDPA in {dtype} unsupported on {device.type}: {exc}"
    return None


def sdpa_dtypes(ctx: Context) -> list[str]:
    """fp16 and bf16 everywhere they work; fp32 too on CPU, where lower precisions may be
    missing and fp32 is what CPU images compute in."""
    if ctx.dtype_choice != "auto":
        return [ctx.dtype_choice]
    names = [n for n in ("fp16", "bf16") if sdpa_support(DTYPES[n], ctx.device) is None]
    if not ctx.accelerated:
        names.append("fp32")
    return names


def sdpa_shapes(ctx: Context, *, gqa: bool) -> tuple[list[int], list[int]]:
    batch, seq, dim = (2, 512, 128) if ctx.accelerated else (2, 64, 64)
    heads_q, heads_kv = (8, 2) if gqa else (4, 4)
    return [batch, heads_q, seq, dim], [batch, heads_kv, seq, dim]


def check_sdpa(
    ctx: Context,
    dtype_name: str,
    *,
    gqa: bool,
    causal: bool,
    attn: AttnFn | None = None,
) -> Metrics:
    """``attn`` replaces SDPA for fault injection (a kernel returning garbage must fail)."""
    unsupported = sdpa_support(DTYPES[dtype_name], ctx.device)
    if unsupported:
        raise Skip(unsupported)
    shape_q, shape_kv = sdpa_shapes(ctx, gqa=gqa)
    inputs = make_qkv(shape_q, shape_kv, dtype=DTYPES[dtype_name], device=ctx.device)
    fn = attn or functools.partial(sdpa, causal=causal)
    reference = functools.partial(math_attention, causal=causal)
    try:
        metrics, reason = compare_attention(fn, reference, inputs, tolerance=TOLERANCE[dtype_name])
    except Exception as exc:
        shape = f"q{shape_q} kv{shape_kv} {dtype_name} {_causal(causal)}"
        msg = f"SDPA failed for {shape}: {type(exc).__name__}: {exc}"
        raise CheckFailed(msg) from exc
    require(reason, metrics)
    return metrics


# --- FlashAttention ---------------------------------------------------------------------


def flash_wanted(ctx: Context) -> bool:
    return ctx.image_field("attention") == "flash_attn" or (
        importlib.util.find_spec("flash_attn") is not None
    )


def run_flash(ctx: Context) -> list[CheckResult]:
    if not flash_wanted(ctx):
        skip = functools.partial(
            _skip, "flash_attn not installed and image attention is not flash_attn"
        )
        return [run_check("L3.flash", skip)]
    gate = run_check("L3.flash.import", functools.partial(check_flash_import, ctx))
    results = [gate]
    cases = [
        (kind, dim, causal)
        for kind in ("dense", "varlen", "gqa")
        for dim in HEAD_DIMS
        for causal in (True, False)
    ]
    for kind, dim, causal in cases:
        name = f"L3.flash.{kind}.hd{dim}.{_causal(causal)}"
        if gate.status != "pass":
            why = f"L3.flash.import did not pass: {gate.reason}"
            results.append(run_check(name, functools.partial(_skip, why)))
            continue
        fn = functools.partial(check_flash_case, ctx, kind, dim=dim, causal=causal)
        results.append(run_check(name, fn))
    speedup = (
        functools.partial(check_flash_speedup, ctx)
        if gate.status == "pass"
        else (functools.partial(_skip, "L3.flash.import did not pass"))
    )
    results.append(run_check("L3.flash.speedup", speedup, required=False))
    return results


def _skip(reason: str) -> Metrics:
    raise Skip(reason)


def check_flash_import(ctx: Context) -> Metrics:
    if not ctx.accelerated:
        msg = "no accelerator: FlashAttention runs on GPUs only"
        if ctx.image_field("attention") == "flash_attn":
            raise CheckFailed(msg + ", but the image's attention is flash_attn")
        raise Skip(msg)
    if importlib.util.find_spec("flash_attn") is None:
        msg = "image attention is flash_attn but flash_attn is not installed"
        raise CheckFailed(msg)
    module = _flash(ctx)
    return {"version": str(getattr(module, "__version__", "unknown"))}


def _flash(ctx: Context) -> ModuleType:
    return ctx.need_module("flash_attn", dist="flash-attn")


def check_flash_case(ctx: Context, kind: str, *, dim: int, causal: bool) -> Metrics:
    flash = _flash(ctx)
    batch, seq, heads_q = 2, 256, 8
    heads_kv = 2 if kind == "gqa" else heads_q
    # flash_attn takes [B, S, H, D]; SDPA, the reference, takes [B, H, S, D].
    q, k, v = make_qkv(
        [batch, seq, heads_q, dim],
        [batch, seq, heads_kv, dim],
        dtype=torch.bfloat16,
        device=ctx.device,
    )
    tolerance = TOLERANCE["bf16"]
    try:
        if kind == "varlen":
            metrics, reason = _compare_varlen(flash, q, k, v, causal=causal, tolerance=tolerance)
        else:
            fn = functools.partial(flash.flash_attn_func, causal=causal)
            metrics, reason = compare_attention(
                fn, functools.partial(_sdpa_bshd, causal=causal), (q, k, v), tolerance=tolerance
            )
    except Exception as exc:
        shape = f"q{list(q.shape)} kv{list(k.shape)} bf16 {_causal(causal)} {kind}"
        msg = f"FlashAttention failed for {shape}: {type(exc).__name__}: {exc}"
        raise CheckFailed(msg) from exc
    require(reason, metrics)
    return metrics


def _sdpa_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    out = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    return out.transpose(1, 2)


def _compare_varlen(
    flash: ModuleType,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    tolerance: float,
) -> tuple[Metrics, str | None]:
    """Pack sequences of unequal length (the padding-free training layout) and compare with
    SDPA run on each sequence alone."""
    lengths = [q.shape[1], q.shape[1] // 2 + 3]
    packed = [torch.cat([t[i, :n] for i, n in enumerate(lengths)]) for t in (q, k, v)]
    cu = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32, device=q.device)

    def flash_fn(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = flash.flash_attn_varlen_func(
            qq, kk, vv, cu, cu, max(lengths), max(lengths), causal=causal
        )
        return out

    def reference(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        pieces = []
        for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            one = [t[start:end].unsqueeze(0) for t in (qq, kk, vv)]
            pieces.append(_sdpa_bshd(*one, causal=causal).squeeze(0))
        return torch.cat(pieces)

    metrics, reason = compare_attention(
        flash_fn, reference, (packed[0], packed[1], packed[2]), tolerance=tolerance
    )
    metrics["seqlens"] = lengths
    return metrics, reason


def check_flash_speedup(ctx: Context) -> Metrics:
    flash = _flash(ctx)
    batch, seq, heads, dim = SPEEDUP_SHAPE
    q, k, v = make_qkv(
        [batch, seq, heads, dim], [batch, seq, heads, dim], dtype=torch.bfloat16, device=ctx.device
    )
    flash_ms, _ = median_ms(lambda: flash.flash_attn_func(q, k, v, causal=True), ctx.device)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    sdpa_ms, _ = median_ms(lambda: sdpa(qt, kt, vt, causal=True), ctx.device)
    # The field figure compares with SDPA's math path (3.911 ms vs 0.169 ms).
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        math_ms, _ = median_ms(lambda: sdpa(qt, kt, vt, causal=True), ctx.device)
    metrics: Metrics = {
        "shape": list(SPEEDUP_SHAPE),
        "flash_ms": flash_ms,
        "sdpa_ms": sdpa_ms,
        "sdpa_math_ms": math_ms,
        "speedup_vs_sdpa": math_ms / flash_ms,
        "speedup_vs_sdpa_default": sdpa_ms / flash_ms,
    }
    if math_ms / flash_ms < 1.0:
        msg = f"FlashAttention ({flash_ms:.3f} ms) is slower than SDPA math ({math_ms:.3f} ms)"
        raise CheckFailed(msg, metrics)
    return metrics
