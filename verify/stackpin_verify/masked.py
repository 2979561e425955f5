"""L3 with masks and lengths as a server sends them (issue 22).

- A padded batch: three sequences of unequal length, padded on the left or the right to one
  length, run through SDPA with a boolean or an additive mask (the additive one also carries
  a real-valued bias, so a kernel that reads it as a boolean fails), and compared row by row
  with the explicit attention of each sequence alone. Padding holds garbage, not zeros, so a
  kernel that ignores the mask or reads it from the wrong end moves every real row.
- FlashAttention's varlen with ``seqlen_q != seqlen_k`` per sequence, separate
  ``cu_seqlens_q`` / ``cu_seqlens_k``, causal aligned bottom-right as flash-attention
  defines it (query row i of a sequence sees keys up to i + seqlen_k - seqlen_q); one
  sequence has a single query row, the decode step.

Every comparison is ``attention.compare_attention``'s: forward and backward against an
explicit attention in float32, bounded by twice the same explicit attention in the dtype.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from stackpin_verify import capability
from stackpin_verify.attention import compare_attention, make_qkv, repeat_kv, torch_release
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import DTYPES, Context

# Three sequences padded to the first one's length; 113 is no kernel's block multiple.
PADDED_LENGTHS = (113, 59, 38)
HEADS = (8, 2)  # grouped-query, as the models a server runs
HEAD_DIM = 64
# What the padded positions hold: far from the real tokens' unit scale, so attending to them
# moves the output, and finite, so an honest kernel's masked scores stay finite too.
PAD_FILL = 3.0
# (query lengths, key lengths) per sequence: q != k, one decode row, one equal pair.
VARLEN_Q = (1, 40, 77)
VARLEN_K = (113, 40, 90)
# The additive bias's draw: the same every run, so a report's numbers repeat.
BIAS_SEED = 7


@dataclass(frozen=True)
class MaskCase:
    dtype: str
    padding: str  # "left" | "right"
    form: str  # "bool" | "additive"
    causal: bool

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "noncausal"
        return f"L3.sdpa.{self.dtype}.padded.{self.padding}.{self.form}.{mask}"


def mask_cases(dtypes: Sequence[str]) -> list[MaskCase]:
    return [
        MaskCase(dtype, padding, form, causal)
        for dtype in dtypes
        for padding in ("left", "right")
        for form in ("bool", "additive")
        for causal in (True, False)
    ]


def run_sdpa(ctx: Context, dtypes: Sequence[str]) -> list[CheckResult]:
    return [
        run_check(case.name, functools.partial(check_padded_sdpa, ctx, case))
        for case in mask_cases(dtypes)
    ]


# --- the padded batch -------------------------------------------------------------------


def key_valid(
    lengths: Sequence[int], total: int, padding: str, device: torch.device
) -> torch.Tensor:
    """[B, S] True where a real token sits."""
    rows = []
    for n in lengths:
        real = torch.ones(n, dtype=torch.bool, device=device)
        pad = torch.zeros(total - n, dtype=torch.bool, device=device)
        rows.append(torch.cat([pad, real] if padding == "left" else [real, pad]))
    return torch.stack(rows)


def padded_mask(valid: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """[B, 1, S, S] boolean: a real query row sees the real keys (up to itself when causal);
    a padding row sees every key, so no row is empty (an empty row's softmax is NaN, and its
    NaN would reach the real rows' gradients). Padding rows are never compared."""
    total = valid.shape[1]
    allowed = valid[:, None, :].expand(-1, total, -1)
    if causal:
        tril = torch.ones(total, total, dtype=torch.bool, device=valid.device).tril()
        allowed = allowed & tril
    allowed = allowed | ~valid[:, :, None]
    return allowed[:, None]


def additive(allowed: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The bias where allowed, -inf elsewhere, in the bias's dtype."""
    return torch.where(allowed, bias, torch.full_like(bias, -math.inf))


def exact_bias(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A real-valued bias in [-2, 2], multiples of 1/8: exact in fp16, bf16 and fp32, so
    the kernel and the reference add the very same values, in the queries' dtype as a
    server (transformers) hands SDPA its additive mask."""
    gen = torch.Generator().manual_seed(BIAS_SEED)
    eighths = torch.randint(-16, 17, tuple(shape), generator=gen)
    return (eighths / 8).to(device=device, dtype=dtype)


def sdpa_masked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """SDPA with ``attn_mask`` on [B, H, S, D], GQA as attention.sdpa does it."""
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if torch_release() >= (2, 5):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return F.scaled_dot_product_attention(q, repeat_kv(q, k), repeat_kv(q, v), attn_mask=mask)


def pad_batch(packed: torch.Tensor, lengths: Sequence[int], padding: str) -> torch.Tensor:
    """Packed [T, H, D] -> [B, S, H, D], PAD_FILL in the padding (differentiable)."""
    total = max(lengths)
    rows = []
    for start, n in zip(_bounds(lengths), lengths):  # noqa: B905 - bounds has one more
        fill = packed.new_full((total - n, *packed.shape[1:]), PAD_FILL)
        piece = packed[start : start + n]
        rows.append(torch.cat([fill, piece] if padding == "left" else [piece, fill]))
    return torch.stack(rows)


def unpad_rows(out: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, S, H, D] -> packed [T, H, D]: the real rows, sequence after sequence."""
    return torch.cat([out[b][valid[b]] for b in range(out.shape[0])])


def _bounds(lengths: Sequence[int]) -> list[int]:
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return bounds


def masked_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Explicit softmax(QK^T/sqrt(d) + bias + causal) V on [B, H, S, D] in the inputs'
    dtype; causal aligned bottom-right when the lengths differ."""
    k, v = repeat_kv(q, k), repeat_kv(q, v)
    scores = q @ k.mT / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias  # promotes to the wider of the two, never narrows
    if causal:
        *_, s_q, s_k = scores.shape
        keep = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(s_k - s_q)
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def per_sequence_reference(
    lengths: Sequence[int], *, causal: bool, bias: Callable[[int], torch.Tensor] | None = None
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """Each sequence alone (no padding, no mask but its own), packed again: the answer a
    padded batch must reproduce row by row. ``bias(i)`` is sequence i's [n, n] bias."""

    def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pieces = []
        for i, (start, end) in enumerate(itertools.pairwise(_bounds(lengths))):
            one = [t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            own = bias(i) if bias is not None else None
            out = masked_math(*one, causal=causal, bias=own)
            pieces.append(out.squeeze(0).transpose(0, 1))
        return torch.cat(pieces)

    return reference


def check_padded_sdpa(ctx: Context, case: MaskCase) -> Metrics:
    from stackpin_verify.level3 import sdpa_unsupported

    unsupported = sdpa_unsupported(case.dtype, ctx.device)
    if unsupported:
        raise Skip(unsupported)
    dtype, lengths = DTYPES[case.dtype], PADDED_LENGTHS
    heads_q, heads_kv = HEADS
    total = sum(lengths)
    inputs = make_qkv(
        [total, heads_q, HEAD_DIM], [total, heads_kv, HEAD_DIM], dtype=dtype, device=ctx.device
    )
    valid = key_valid(lengths, max(lengths), case.padding, ctx.device)
    allowed = padded_mask(valid, causal=case.causal)
    bias = exact_bias(allowed.shape, dtype, ctx.device)
    mask = allowed if case.form == "bool" else additive(allowed, bias)

    def batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        qp, kp, vp = (pad_batch(t, lengths, case.padding).transpose(1, 2) for t in (q, k, v))
        out = sdpa_masked(qp, kp, vp, mask)
        return unpad_rows(out.transpose(1, 2), valid)

    def own_bias(i: int) -> torch.Tensor:
        rows = valid[i]
        return bias[i, 0][rows][:, rows]

    reference = per_sequence_reference(
        lengths, causal=case.causal, bias=own_bias if case.form == "additive" else None
    )
    metrics = judged(f"SDPA ({case.name})", lambda: compare_attention(batched, reference, inputs))
    metrics["seqlens"] = list(lengths)
    return metrics


def judged(what: str, compare: Callable[[], tuple[Metrics, str | None]]) -> Metrics:
    """A comparison's verdict; an exception from the kernel is a failure quoting it."""
    try:
        metrics, reason = compare()
    except Exception as exc:
        msg = f"{what} failed: {type(exc).__name__}: {exc}"
        raise CheckFailed(msg) from exc
    require(reason, metrics)
    return metrics


# --- FlashAttention varlen with seqlen_q != seqlen_k -------------------------------------


def varlen_qk_names(dtypes: Sequence[str]) -> list[tuple[str, str, bool]]:
    """(check name, dtype, causal) of each uneven varlen case, dense and GQA."""
    found = []
    for dtype, kind, causal in itertools.product(dtypes, ("dense", "gqa"), (True, False)):
        mask = "causal" if causal else "noncausal"
        found.append((f"L3.flash.{dtype}.varlen_qk.{kind}.{mask}", dtype, causal))
    return found


def run_flash(ctx: Context, dtypes: Sequence[str], flash: ModuleType | None) -> list[CheckResult]:
    """The uneven varlen cases; ``flash`` is None when L3.flash.import did not pass (each
    case then skips, saying so)."""
    results = []
    for name, dtype, causal in varlen_qk_names(dtypes):
        gqa = ".gqa." in name
        if flash is None:
            check = functools.partial(_skip, "L3.flash.import did not pass")
        else:
            check = functools.partial(check_varlen_qk, ctx, flash, dtype, causal=causal, gqa=gqa)
        results.append(run_check(name, check))
    return results


def _skip(reason: str) -> Metrics:
    raise Skip(reason)


def check_varlen_qk(
    ctx: Context, flash: ModuleType, dtype_name: str, *, causal: bool, gqa: bool
) -> Metrics:
    unsupported = capability.unsupported(dtype_name, ctx.device, probe=lambda: None)
    if unsupported:
        raise Skip(unsupported)
    heads_q, heads_kv = HEADS if gqa else (HEADS[0], HEADS[0])
    q, k, v = make_qkv(
        [sum(VARLEN_Q), heads_q, HEAD_DIM],
        [sum(VARLEN_K), heads_kv, HEAD_DIM],
        dtype=DTYPES[dtype_name],
        device=ctx.device,
    )
    cu_q = torch.tensor(_bounds(VARLEN_Q), dtype=torch.int32, device=ctx.device)
    cu_k = torch.tensor(_bounds(VARLEN_K), dtype=torch.int32, device=ctx.device)

    def kernel(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = flash.flash_attn_varlen_func(
            qq, kk, vv, cu_q, cu_k, max(VARLEN_Q), max(VARLEN_K), causal=causal
        )
        return out

    def reference(qq: torch.Tensor, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        pieces = []
        spans_q = itertools.pairwise(_bounds(VARLEN_Q))
        spans_k = itertools.pairwise(_bounds(VARLEN_K))
        for (qa, qb), (ka, kb) in zip(spans_q, spans_k, strict=True):
            one = [t.transpose(0, 1).unsqueeze(0) for t in (qq[qa:qb], kk[ka:kb], vv[ka:kb])]
            pieces.append(masked_math(*one, causal=causal).squeeze(0).transpose(0, 1))
        return torch.cat(pieces)

    compare = functools.partial(compare_attention, kernel, reference, (q, k, v))
    metrics = judged("FlashAttention varlen", compare)
    metrics.update(seqlens_q=list(VARLEN_Q), seqlens_k=list(VARLEN_K))
    return metrics
