"""Runs the selected levels and assembles the report."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from stackpin_verify import environment, imports, level0
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, run_check
from stackpin_verify.context import Context
from stackpin_verify.torchnames import CPU, GPU

LEVEL_MODULES = {
    0: "stackpin_verify.level0",
    1: "stackpin_verify.level1",
    2: "stackpin_verify.level2",
    3: "stackpin_verify.level3",
    4: "stackpin_verify.level4",
    5: "stackpin_verify.level5",
    6: "stackpin_verify.level6",
    7: "stackpin_verify.level7",
    8: "stackpin_verify.level8",
}


def make_context(
    *,
    image_path: Path | None,
    dtype_choice: str,
) -> Context:
    image: dict[str, Any] | None = None
    error: str | None = None
    if image_path is not None:
        try:
            image = environment.load_image_info(image_path)
        except environment.ImageInfoError as exc:
            error = str(exc)
    backend = environment.detect_backend()
    # HIP builds expose their devices through the torch.cuda API as "cuda" devices.
    device = torch.device(GPU if torch.cuda.is_available() else CPU)
    return Context(
        backend=backend,
        device=device,
        image=image,
        dtype_choice=dtype_choice,
        image_error=error,
    )


# The levels that run kernels on the device (L1 GEMM to L7 collectives). In an accelerator
# image run with --no-devices they would otherwise run their CPU paths and pass, proving
# nothing about the image's device stack: each is one "unsupported: no device" line. L0
# (the install) and L8 (the service, on Studio's CPU fallback) still run.
DEVICE_LEVELS = frozenset(range(1, 8))


def unsupported_here(ctx: Context, level: int) -> str | None:
    """Why a level cannot run in this run at all, whether requested or not."""
    if level in DEVICE_LEVELS and level0.no_device_run(ctx):
        return level0.UNSUPPORTED_NO_DEVICE
    return None


def left_out_by_default(ctx: Context, level: int) -> str | None:
    """Why a level that cannot pass anything on this host stays out of a default run (it
    still runs, and must pass something, when requested with --levels)."""
    if level == 2 and not ctx.accelerated:
        return "no accelerator: the Triton kernels compile for a GPU"
    declared = ctx.image_field("bitsandbytes") or ctx.declares("bitsandbytes")
    if level == 4 and not declared and importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is neither installed nor declared by the image"
    if level == 8 and not (ctx.image or {}).get("service"):
        return "the image declares no service"
    return None


def judge_level(results: Sequence[CheckResult], *, accelerated: bool) -> str | None:
    """A level that passed nothing proved nothing: a kernel built for another device skips
    its way to green otherwise. On an accelerator its required checks must pass too."""
    if not any(r.status == "pass" for r in results):
        reasons = sorted({r.reason.splitlines()[0][:120] for r in results if r.reason})
        return "no check passed" + (": " + "; ".join(reasons[:3]) if reasons else "")
    if accelerated and not any(r.status == "pass" and r.required for r in results):
        return "on an accelerator, every required check skipped"
    return None


def run_levels(
    ctx: Context, levels: Iterable[int], *, requested: bool = True
) -> tuple[list[CheckResult], dict[int, float]]:
    """All checks of the levels in order, and each level's wall-clock seconds. Levels named
    explicitly (``requested``) always run; a default run leaves out what cannot apply here
    and says so in an ``L<n>.level`` skip.

    L0.imports' child interpreters start before the first level and are judged after the
    last (reported with L0, its wait counted in L0's seconds): the first imports of unsloth
    and FlashAttention 4 took longer than all of L1, L2, L4 and L6 on the H200."""
    wanted = sorted(set(levels))
    deferred = 0 in wanted and imports.start(ctx)
    ctx.cache[imports.DEFERRED] = deferred
    per_level: dict[int, list[CheckResult]] = {}
    durations: dict[int, float] = {}
    for level in wanted:
        start = time.perf_counter()
        per_level[level] = _run_level(ctx, level, requested=requested,
                                      judged=not (deferred and level == 0))
        durations[level] = time.perf_counter() - start
    if deferred:
        start = time.perf_counter()
        found = per_level[0]
        found.append(run_check(imports.CHECK, functools.partial(imports.check_imports, ctx)))
        found.extend(_verdict(found, 0, accelerated=ctx.accelerated))
        durations[0] += time.perf_counter() - start
    return [r for level in wanted for r in per_level[level]], durations


def _run_level(ctx: Context, level: int, *, requested: bool, judged: bool) -> list[CheckResult]:
    if (unsupported := unsupported_here(ctx, level)) is not None:
        return [run_check(f"L{level}.level", functools.partial(_skip, unsupported))]
    left_out = None if requested else left_out_by_default(ctx, level)
    if left_out is not None:
        return [run_check(f"L{level}.level", functools.partial(_left_out, left_out))]
    module = importlib.import_module(LEVEL_MODULES[level])
    found: list[CheckResult] = module.run(ctx)
    if judged:
        found.extend(_verdict(found, level, accelerated=ctx.accelerated))
    return found


def _verdict(found: Sequence[CheckResult], level: int, *, accelerated: bool) -> list[CheckResult]:
    verdict = judge_level(found, accelerated=accelerated)
    if verdict is None:
        return []
    return [run_check(f"L{level}.level", functools.partial(_fail, verdict))]


def _skip(reason: str) -> Metrics:
    raise Skip(reason)


def _left_out(reason: str) -> Metrics:
    msg = f"left out of the default run: {reason}; --levels runs it"
    raise Skip(msg)


def _fail(reason: str) -> Metrics:
    raise CheckFailed(reason)
