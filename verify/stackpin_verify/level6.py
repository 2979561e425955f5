"""L6 correctness: greedy generation after training reproduces the memorised answers, and
degenerate output fails loudly (the field's GPTQ kernel served 200 OK with hundreds of one
repeated character)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stackpin_verify import tinylm
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, require, run_check
from stackpin_verify.context import Context, tiny_work_threads
from stackpin_verify.level5 import trained_session
from stackpin_verify.training import judge_trace

# Room past the longest answer so a model that never stops shows its repetition.
EXTRA_TOKENS = 8
MIN_RUN = 6


@dataclass
class Generation:
    prompt: str
    expected: str
    text: str
    ids: list[int]
    logits: list[torch.Tensor]


def run(ctx: Context) -> list[CheckResult]:
    with tiny_work_threads(ctx.device):
        return [
            run_check("L6.golden", functools.partial(check_golden, ctx)),
            run_check("L6.degenerate", functools.partial(check_degenerate, ctx)),
            run_check("L6.logits_finite", functools.partial(check_logits_finite, ctx)),
        ]


def generate_all(
    model: Any, tokenizer: Any, cases: Sequence[tuple[str, str]], device: torch.device
) -> list[Generation]:
    found = []
    for prompt, expected in cases:
        ids, logits = tinylm.greedy_decode(
            model, tokenizer, prompt, max_new_tokens=len(expected) + EXTRA_TOKENS, device=device
        )
        text = tokenizer.decode(ids, skip_special_tokens=True)
        found.append(Generation(prompt, expected, text, ids, logits))
    return found


def generations(ctx: Context) -> list[Generation]:
    cached = ctx.cache.get("generations")
    if cached is None:
        session = trained_session(ctx)
        assert session.trace is not None
        # Generation from a model that did not learn says nothing about correctness.
        reason = judge_trace(session.trace)
        if reason:
            msg = f"training (L5.lora.train) failed, nothing to generate from: {reason}"
            raise CheckFailed(msg)
        cached = generate_all(session.model, session.tokenizer, tinylm.GOLDEN, ctx.device)
        ctx.cache["generations"] = cached
    assert isinstance(cached, list)
    return cached


def judge_golden(found: Sequence[Generation]) -> str | None:
    wrong = [g for g in found if g.text != g.expected]
    if not wrong:
        return None
    shown = "; ".join(f"{g.prompt!r} -> {g.text!r} (expected {g.expected!r})" for g in wrong[:3])
    return f"{len(wrong)} of {len(found)} golden answers differ: {shown}"


def detect_degenerate(text: str, ids: Sequence[int], *, min_run: int = MIN_RUN) -> str | None:
    """One token or one character repeated: the signature of a broken dequant or
    attention kernel whose output is still well-formed text."""
    if len(ids) >= min_run and len(set(ids)) == 1:
        return f"one token (id {ids[0]}) repeated {len(ids)} times"
    run_char, run_len, best_char, best_len = "", 0, "", 0
    for char in text:
        run_len = run_len + 1 if char == run_char else 1
        run_char = char
        if run_len > best_len:
            best_char, best_len = char, run_len
    if best_len >= min_run:
        return f"character {best_char!r} repeated {best_len} times"
    return None


def detect_nonfinite(logits: Sequence[torch.Tensor]) -> str | None:
    for step, row in enumerate(logits):
        if not bool(torch.isfinite(row).all()):
            nan = int(torch.isnan(row).sum())
            inf = int(torch.isinf(row).sum())
            return f"logits at generation step {step} hold {nan} NaN and {inf} Inf values"
    return None


def check_golden(ctx: Context, found: Sequence[Generation] | None = None) -> Metrics:
    found = generations(ctx) if found is None else found
    metrics: Metrics = {
        "cases": len(found),
        "exact": sum(g.text == g.expected for g in found),
        "outputs": [g.text for g in found],
    }
    require(judge_golden(found), metrics)
    return metrics


def check_degenerate(ctx: Context, found: Sequence[Generation] | None = None) -> Metrics:
    found = generations(ctx) if found is None else found
    problems = [
        f"{g.prompt!r}: {reason}"
        for g in found
        if (reason := detect_degenerate(g.text, g.ids)) is not None
    ]
    metrics: Metrics = {"cases": len(found), "degenerate": len(problems)}
    if problems:
        msg = "degenerate output: " + "; ".join(problems[:3])
        raise CheckFailed(msg, metrics)
    return metrics


def check_logits_finite(ctx: Context, found: Sequence[Generation] | None = None) -> Metrics:
    found = generations(ctx) if found is None else found
    steps = sum(len(g.logits) for g in found)
    metrics: Metrics = {"steps": steps}
    for g in found:
        reason = detect_nonfinite(g.logits)
        if reason:
            msg = f"{g.prompt!r}: {reason}"
            raise CheckFailed(msg, metrics)
    return metrics
