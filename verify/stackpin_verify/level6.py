"""L6 correctness: greedy generation on the device reproduces answers computed once in
float64 on CPU (golden-l6.json, written by golden.py from the fixed model in fixedlm.py),
token for token, with every step's logits within the dtype's tolerance; and degenerate
output fails loudly (the field's GPTQ kernel served 200 OK with hundreds of one repeated
character). Nothing here depends on L5: the model is fixed, not trained."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from stackpin_verify import batched, capability, fixedlm, golden
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import DTYPES, Context, tiny_work_threads
from stackpin_verify.torchnames import CPU

DTYPE_NAMES = ("fp32", "fp16", "bf16")
# Both ways a model generates: the whole sequence again at every step, and one new token
# against the KV cache (decode-time attention runs other kernels than the prompt's).
PATHS = ("full", "kv_cache")
MIN_RUN = 6


@dataclass
class Generation:
    """One prompt's greedy answer from the device, by one decoding path, in one dtype."""

    dtype: str
    path: str
    expected: golden.Case
    found: fixedlm.Decoded

    @property
    def label(self) -> str:
        return f"{self.dtype}/{self.path} prompt {fixedlm.text(self.expected.prompt)!r}"


def run(ctx: Context) -> list[CheckResult]:
    with tiny_work_threads(ctx.device):
        results = [
            run_check(f"L6.golden.{name}", functools.partial(check_golden, ctx, name))
            for name in DTYPE_NAMES
        ]
        results.extend(
            run_check(f"L6.batched.{name}", functools.partial(check_batched, ctx, name))
            for name in DTYPE_NAMES
        )
        results.append(run_check("L6.degenerate", functools.partial(check_degenerate, ctx)))
        results.append(run_check("L6.logits_finite", functools.partial(check_logits_finite, ctx)))
    return results


def generate(
    model: object, dtype: str, cases: Sequence[golden.Case], device: torch.device
) -> list[Generation]:
    return [
        Generation(
            dtype,
            path,
            case,
            fixedlm.device_greedy(
                model, case.prompt, len(case.tokens), device, kv_cache=path == "kv_cache"
            ),
        )
        for path in PATHS
        for case in cases
    ]


def generations(ctx: Context, dtype: str) -> list[Generation]:
    """The device's answers in `dtype` (computed once per run; the checks share them)."""
    cache = ctx.cache.setdefault("l6", {})
    if dtype not in cache:
        ctx.need_module("transformers")
        reference = golden.load()
        model = fixedlm.qwen2_model(fixedlm.weights(reference.seed), DTYPES[dtype], ctx.device)
        cache[dtype] = generate(model, dtype, reference.cases, ctx.device)
    found = cache[dtype]
    assert isinstance(found, list)
    return found


def dtype_unsupported(ctx: Context, dtype: str) -> str | None:
    """capability.py decides. On CPU its probe is the generation itself: a torch that cannot
    run this model in the dtype (the dispatcher's "not implemented for 'Half'", as older
    CPU torches say for some ops) skips; any other exception fails."""
    return capability.unsupported(dtype, ctx.device, functools.partial(generations, ctx, dtype))


def step_errors(gen: Generation) -> list[float]:
    """Max |device - golden| logit at each step the device reached with the golden prefix
    (up to and including its first wrong token; later steps answer another question)."""
    errors = []
    for step, row in enumerate(gen.found.logits):
        want = torch.tensor(gen.expected.logits[step], dtype=torch.float64)
        errors.append(float((row.detach().to(CPU, torch.float64) - want).abs().max()))
        if gen.found.tokens[step] != gen.expected.tokens[step]:
            break
    return errors


def judge_generation(gen: Generation) -> str | None:
    """Why `gen` differs from its golden answer, or None: exact tokens, and every step's
    logits within FACTOR * u * max|golden logits of that step|."""
    want, got = gen.expected.tokens, gen.found.tokens
    if len(got) != len(want):
        return f"{gen.label}: {len(got)} steps, the golden answer has {len(want)}"
    relative = golden.relative_tolerance(gen.dtype)
    for step, error in enumerate(step_errors(gen)):
        tol = relative * gen.expected.scales[step]
        if not error <= tol:  # written so that NaN fails
            return (
                f"{gen.label}: step {step} logits off by {error:.4g} "
                f"(tolerance {tol:.4g} = {golden.FACTOR[gen.dtype]:g} u x max|logit|)"
            )
    if got != want:
        step = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        return (
            f"{gen.label}: answered {fixedlm.text(got)!r}, golden {fixedlm.text(want)!r} "
            f"(first difference at step {step})"
        )
    return None


def worst_ratio(found: Sequence[Generation]) -> float | None:
    """The largest step error as a fraction of its tolerance (1.0 = at the tolerance)."""
    ratios = [
        error / (golden.relative_tolerance(g.dtype) * g.expected.scales[step])
        for g in found
        for step, error in enumerate(step_errors(g))
    ]
    return max(ratios, default=None)


def judge_golden(found: Sequence[Generation]) -> str | None:
    if not found:
        return "no golden case was generated"
    wrong = [reason for g in found if (reason := judge_generation(g)) is not None]
    if not wrong:
        return None
    return f"{len(wrong)} of {len(found)} golden answers differ: " + "; ".join(wrong[:3])


def check_golden(ctx: Context, dtype: str, found: Sequence[Generation] | None = None) -> Metrics:
    if found is None:
        unsupported = dtype_unsupported(ctx, dtype)
        if unsupported:
            raise Skip(unsupported)
        found = generations(ctx, dtype)
    metrics: Metrics = {
        "cases": len(found),
        "exact": sum(g.found.tokens == g.expected.tokens for g in found),
        "paths": sorted({g.path for g in found}),
        "error_ratio": worst_ratio(found),
        "factor": golden.FACTOR[dtype],
        "min_margin_ratio": min(
            (
                m / s
                for g in found
                for m, s in zip(g.expected.margins, g.expected.scales, strict=True)
            ),
            default=0.0,
        ),
        "outputs": [fixedlm.text(g.found.tokens) for g in found if g.path == PATHS[0]],
    }
    require(judge_golden(found), metrics)
    return metrics


# Golden prompts lengthened by 0-3 of their own golden tokens: unequal lengths, so the batch
# is padded, and every step still one whose margin golden.py guaranteed.
BATCH_EXTEND = 4


def batch_prompts(cases: Sequence[golden.Case]) -> tuple[list[list[int]], int]:
    """(prompts of unequal length, steps each can still take along its golden answer)."""
    prompts = [
        list(case.prompt) + list(case.tokens[: i % BATCH_EXTEND]) for i, case in enumerate(cases)
    ]
    steps = min(len(case.tokens) for case in cases) - (BATCH_EXTEND - 1)
    return prompts, steps


def check_batched(ctx: Context, dtype: str) -> Metrics:
    """The golden prompts in one left-padded batch against the KV cache answer as each
    does alone (issue 22): what a server does with them."""
    unsupported = dtype_unsupported(ctx, dtype)
    if unsupported:
        raise Skip(unsupported)
    reference = golden.load()
    model = fixedlm.qwen2_model(fixedlm.weights(reference.seed), DTYPES[dtype], ctx.device)
    prompts, steps = batch_prompts(reference.cases)
    labels = [fixedlm.text(p) for p in prompts]
    metrics, reason = batched.compare(model, prompts, labels, steps, pad_id=0, device=ctx.device)
    require(reason, metrics)
    return metrics


def all_generations(ctx: Context) -> list[Generation]:
    """Every dtype's answers that the golden checks produced (or that this host supports)."""
    found: list[Generation] = []
    for dtype in DTYPE_NAMES:
        if dtype_unsupported(ctx, dtype) is None:
            found.extend(generations(ctx, dtype))
    return found


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


def check_degenerate(ctx: Context, found: Sequence[Generation] | None = None) -> Metrics:
    found = all_generations(ctx) if found is None else found
    problems = [
        f"{g.label}: {reason}"
        for g in found
        if (reason := detect_degenerate(fixedlm.text(g.found.tokens), g.found.tokens)) is not None
    ]
    metrics: Metrics = {"cases": len(found), "degenerate": len(problems)}
    if problems:
        msg = "degenerate output: " + "; ".join(problems[:3])
        raise CheckFailed(msg, metrics)
    return metrics


def check_logits_finite(ctx: Context, found: Sequence[Generation] | None = None) -> Metrics:
    found = all_generations(ctx) if found is None else found
    steps = sum(len(g.found.logits) for g in found)
    metrics: Metrics = {"steps": steps}
    for g in found:
        reason = detect_nonfinite(g.found.logits)
        if reason:
            msg = f"{g.label}: {reason}"
            raise CheckFailed(msg, metrics)
    return metrics
