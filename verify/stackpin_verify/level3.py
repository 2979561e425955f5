"""L3 attention: SDPA and, where shipped, FlashAttention against an explicit attention in
float32, judged as flash-attention's own tests judge (attention.compare_attention)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from stackpin_verify import attention_range, attn_timing, capability, flashpkg, masked
from stackpin_verify.attention import (
    AttnFn,
    compare_attention,
    make_qkv,
    math_attention,
    sdpa,
    sdpa_math_path,
)
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import DTYPES, Context, tiny_work_threads
from stackpin_verify.timing import median_ms

# (sequence length, head dim). Lengths that are not multiples of any kernel's block size
# (flash-attention's tests use 113 and 1023) exercise the masked tails; head dims 96 and 256
# the less common tile shapes. CPU keeps small shapes: the criterion does not need big ones.
GPU_SHAPES = (
    (113, 64),
    (113, 96),
    (113, 128),
    (113, 256),
    (1023, 64),
    (1023, 128),
    (2048, 64),
    (2048, 128),
)
CPU_SHAPES = ((113, 64), (113, 128))
SDPA_KINDS = ("dense", "gqa")
FLASH_KINDS = ("dense", "gqa", "varlen", "varlen_gqa")
# The field's measured FlashAttention case (dcu-facts): [2, 1024, 16, 64] bf16 forward.
SPEEDUP_SHAPE = (2, 1024, 16, 64)


@dataclass(frozen=True)
class Case:
    kernel: str  # "sdpa" | "flash"
    dtype: str
    kind: str  # dense | gqa | varlen | varlen_gqa
    seqlen: int
    dim: int
    causal: bool

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "noncausal"
        return f"L3.{self.kernel}.{self.dtype}.{self.kind}.s{self.seqlen}.hd{self.dim}.{mask}"

    @property
    def heads(self) -> tuple[int, int]:
        """(query heads, KV heads): GQA shares each KV head among 4 query heads."""
        return (8, 2) if self.kind.endswith("gqa") else (8, 8)

    def describe(self) -> str:
        mask = "causal" if self.causal else "noncausal"
        return f"{self.kind} seqlen {self.seqlen} head dim {self.dim} {self.dtype} {mask}"


def run(ctx: Context) -> list[CheckResult]:
    with tiny_work_threads(ctx.device):
        results = [
            run_check(case.name, functools.partial(check_sdpa, ctx, case))
            for case in cases(ctx, "sdpa")
        ]
        results.extend(run_sdpa_edges(ctx))
        results.extend(run_flash(ctx))
        # Stable versus enhanced: the package against SDPA's default backend (issue 20).
        speed = functools.partial(attn_timing.check, ctx)
        results.append(run_check(attn_timing.CHECK, speed, required=False))
    return results


def dtype_names(ctx: Context, kernel: str) -> list[str]:
    """fp16 and bf16, the dtypes attention kernels exist for; fp32 too for SDPA on CPU,
    what CPU images compute in. Each becomes checks; capability.py decides which skip."""
    if ctx.dtype_choice != "auto":
        return [ctx.dtype_choice]
    names = ["fp16", "bf16"]
    if kernel == "sdpa" and not ctx.accelerated:
        names.append("fp32")
    return names


def cases(ctx: Context, kernel: str) -> list[Case]:
    shapes = GPU_SHAPES if ctx.accelerated else CPU_SHAPES
    kinds = SDPA_KINDS if kernel == "sdpa" else FLASH_KINDS
    return [
        Case(kernel, dtype, kind, seqlen, dim, causal)
        for dtype in dtype_names(ctx, kernel)
        for kind in kinds
        for seqlen, dim in shapes
        for causal in (True, False)
    ]


def run_sdpa_edges(ctx: Context) -> list[CheckResult]:
    """SDPA with padding masks and at the top of each dtype's range (issue 22)."""
    dtypes = dtype_names(ctx, "sdpa")
    results = masked.run_sdpa(ctx, dtypes)
    results.extend(
        attention_range.run(
            ctx,
            "sdpa",
            dtypes,
            functools.partial(sdpa, causal=False),
            functools.partial(sdpa_unsupported, device=ctx.device),
        )
    )
    return results


def run_flash_edges(ctx: Context, gate: CheckResult) -> list[CheckResult]:
    """FlashAttention's uneven varlen and range cases, each skipping while the gate fails."""
    dtypes = dtype_names(ctx, "flash")
    flash = _flash(ctx) if gate.status == "pass" else None
    results = masked.run_flash(ctx, dtypes, flash)
    if flash is None:
        skip = functools.partial(_skip, "L3.flash.import did not pass")
        names = attention_range.range_names("flash", dtypes)
        return results + [run_check(name, skip) for name, _, _ in names]

    def unsupported(dtype: str) -> str | None:
        return capability.unsupported(dtype, ctx.device, probe=lambda: None)

    kernel = attention_range.flash_bhsd(flash.flash_attn_func)
    results.extend(attention_range.run(ctx, "flash", dtypes, kernel, unsupported))
    return results


def sdpa_unsupported(name: str, device: torch.device) -> str | None:
    dtype = DTYPES[name]

    def probe() -> object:
        q = torch.ones(1, 1, 4, 8, dtype=dtype, device=device, requires_grad=True)
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.autograd.backward(out.sum())
        return out

    return capability.unsupported(name, device, probe)


def check_sdpa(ctx: Context, case: Case, attn: AttnFn | None = None) -> Metrics:
    """``attn`` replaces SDPA for fault injection (a kernel returning garbage must fail)."""
    unsupported = sdpa_unsupported(case.dtype, ctx.device)
    if unsupported:
        raise Skip(unsupported)
    heads_q, heads_kv = case.heads
    batch = 2
    inputs = make_qkv(
        [batch, heads_q, case.seqlen, case.dim],
        [batch, heads_kv, case.seqlen, case.dim],
        dtype=DTYPES[case.dtype],
        device=ctx.device,
    )
    fn = attn or functools.partial(sdpa, causal=case.causal)
    reference = functools.partial(math_attention, causal=case.causal)
    return _judged("SDPA", case, lambda: compare_attention(fn, reference, inputs))


def _judged(
    kernel: str, case: Case, compare: Callable[[], tuple[Metrics, str | None]]
) -> Metrics:
    """Run a comparison; an exception from the kernel is a failure that quotes it."""
    try:
        metrics, reason = compare()
    except Exception as exc:
        msg = f"{kernel} failed for {case.describe()}: {type(exc).__name__}: {exc}"
        raise CheckFailed(msg) from exc
    require(reason, metrics)
    return metrics


# --- FlashAttention ---------------------------------------------------------------------


def flash_wanted(ctx: Context) -> bool:
    return flashpkg.discover(ctx.image_field("attention")) is not None


def run_flash(ctx: Context) -> list[CheckResult]:
    if not flash_wanted(ctx):
        skip = functools.partial(
            _skip, "flash_attn not installed and image attention is not flash_attn"
        )
        return [run_check("L3.flash", skip)]
    gate = run_check("L3.flash.import", functools.partial(check_flash_import, ctx))
    results = [gate]
    for case in cases(ctx, "flash"):
        if gate.status != "pass":
            why = f"L3.flash.import did not pass: {gate.reason}"
            results.append(run_check(case.name, functools.partial(_skip, why)))
            continue
        results.append(run_check(case.name, functools.partial(check_flash_case, ctx, case)))
    results.extend(run_flash_edges(ctx, gate))
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
        if flashpkg.declared(ctx.image_field("attention")):
            declared = ctx.image_field("attention")
            msg_0 = f"{msg}, but the image's attention is {declared}"
            raise CheckFailed(msg_0)
        raise Skip(msg)
    name = flashpkg.discover(ctx.image_field("attention"))
    if name is None or not flashpkg.installed(name):
        msg = f"image attention is {ctx.image_field('attention')} but it is not installed"
        raise CheckFailed(msg)
    arch = capability.device_arch(ctx.device)
    unsupported = capability.flash_unsupported(arch)
    if unsupported:
        raise CheckFailed(unsupported)
    module = _flash(ctx)
    return {"version": str(getattr(module, "__version__", "unknown")), "arch": arch,
            "package": name}


def _flash(ctx: Context) -> ModuleType:
    name = flashpkg.discover(ctx.image_field("attention")) or "flash_attn"
    ctx.need_module(name, dist=flashpkg.PACKAGES[name])
    return flashpkg.load(name)


def varlen_lengths(seqlen: int) -> list[int]:
    """Three unequal sequences, the longest ``seqlen`` (the padding-free training layout)."""
    return [seqlen, seqlen // 2 + 3, seqlen // 3 + 1]


def check_flash_case(ctx: Context, case: Case, flash: ModuleType | None = None) -> Metrics:
    """``flash`` replaces the flash_attn module (tests inject faulty kernels)."""
    unsupported = capability.unsupported(case.dtype, ctx.device, probe=lambda: None)
    if unsupported:
        raise Skip(unsupported)
    flash = flash or _flash(ctx)
    heads_q, heads_kv = case.heads
    varlen = case.kind.startswith("varlen")
    batch = 3 if varlen else 2
    # flash_attn takes [B, S, H, D]; the explicit reference takes [B, H, S, D].
    q, k, v = make_qkv(
        [batch, case.seqlen, heads_q, case.dim],
        [batch, case.seqlen, heads_kv, case.dim],
        dtype=DTYPES[case.dtype],
        device=ctx.device,
    )
    if varlen:
        return _judged("FlashAttention", case, lambda: _compare_varlen(flash, q, k, v, case))
    fn = functools.partial(flash.flash_attn_func, causal=case.causal)
    reference = functools.partial(_math_bshd, causal=case.causal)
    return _judged("FlashAttention", case, lambda: compare_attention(fn, reference, (q, k, v)))


def _math_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    out = math_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    return out.transpose(1, 2)


def _compare_varlen(
    flash: ModuleType, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, case: Case
) -> tuple[Metrics, str | None]:
    """Pack sequences of unequal length and compare with the explicit attention run on
    each sequence alone: a kernel attending across sequence boundaries fails."""
    lengths = varlen_lengths(case.seqlen)
    packed = [torch.cat([t[i, :n] for i, n in enumerate(lengths)]) for t in (q, k, v)]
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int32, device=q.device)

    def flash_fn(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = flash.flash_attn_varlen_func(
            qq, kk, vv, cu, cu, max(lengths), max(lengths), causal=case.causal
        )
        return out

    def reference(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        pieces = []
        for start, end in itertools.pairwise(bounds):
            one = [t[start:end].unsqueeze(0) for t in (qq, kk, vv)]
            pieces.append(_math_bshd(*one, causal=case.causal).squeeze(0))
        return torch.cat(pieces)

    metrics, reason = compare_attention(flash_fn, reference, (packed[0], packed[1], packed[2]))
    metrics["seqlens"] = lengths
    return metrics, reason


def check_flash_speedup(ctx: Context, flash: ModuleType | None = None) -> Metrics:
    """FlashAttention's time against SDPA's default kernel (what a model gets without
    FlashAttention) and against SDPA's math path (the field's 3.911 ms vs 0.169 ms figure),
    both named as such. Fails only when FlashAttention is slower than the math path."""
    flash = flash or _flash(ctx)
    batch, seq, heads, dim = SPEEDUP_SHAPE
    q, k, v = make_qkv(
        [batch, seq, heads, dim], [batch, seq, heads, dim], dtype=torch.bfloat16, device=ctx.device
    )
    flash_ms, _ = median_ms(lambda: flash.flash_attn_func(q, k, v, causal=True), ctx.device)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    default_ms, _ = median_ms(lambda: sdpa(qt, kt, vt, causal=True), ctx.device)
    with sdpa_math_path():
        math_ms, _ = median_ms(lambda: sdpa(qt, kt, vt, causal=True), ctx.device)
    metrics: Metrics = {
        "shape": list(SPEEDUP_SHAPE),
        "flash_ms": flash_ms,
        "sdpa_default_ms": default_ms,
        "sdpa_math_ms": math_ms,
        "speedup_vs_sdpa_default": default_ms / flash_ms,
        "speedup_vs_sdpa_math": math_ms / flash_ms,
    }
    if not math_ms / flash_ms >= 1.0:
        msg = f"FlashAttention ({flash_ms:.3f} ms) is slower than SDPA math ({math_ms:.3f} ms)"
        raise CheckFailed(msg, metrics)
    return metrics
