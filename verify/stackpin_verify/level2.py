"""L2 JIT: Triton kernels compiled here and compared with torch; HIP linker sanity."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from stackpin_verify.checks import CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import Context
from stackpin_verify.timing import median_ms
from stackpin_verify.torchnames import BACKEND_HIP, CPU

VECTOR_ELEMENTS = 1_048_576  # the field's HIP vector-add size (dcu-facts)
SOFTMAX_SHAPE = (1823, 781)  # odd sizes exercise the masked tail of each row
SOFTMAX_TOLERANCE = 1e-5


def run(ctx: Context) -> list[CheckResult]:
    return [
        run_check("L2.triton.hip_lld", functools.partial(check_hip_lld, ctx)),
        run_check("L2.triton.vector_add", functools.partial(check_vector_add, ctx)),
        run_check("L2.triton.softmax", functools.partial(check_softmax, ctx)),
    ]


def judge_hip_lld(
    value: str | None, *, is_file: Callable[[str], bool], required_on: str
) -> str | None:
    """Triton on HIP links HSACO with the file TRITON_HIP_LLD_PATH names; one called plain
    ``lld`` fails with ``PassManager::run failed`` (dcu-facts), so the name must be ld.lld.
    ``required_on``: the image's platform title when its facts say the variable must be
    set (DTK: the toolkit's ld.lld), else ""."""
    if not value:
        if required_on:
            return (f"TRITON_HIP_LLD_PATH is unset on a {required_on} image: point it at "
                    f"{required_on}'s ld.lld")
        return None
    if Path(value).name != "ld.lld":
        return f"TRITON_HIP_LLD_PATH={value} is not a file named ld.lld (HSACO link would fail)"
    if not is_file(value):
        return f"TRITON_HIP_LLD_PATH={value} does not exist"
    return None


def check_hip_lld(ctx: Context) -> Metrics:
    if ctx.backend != BACKEND_HIP:
        msg = f"backend is {ctx.backend}: the HIP linker path only matters on HIP builds"
        raise Skip(msg)
    value = os.environ.get("TRITON_HIP_LLD_PATH")
    facts = ctx.platform_facts
    required_on = str(facts.get("title") or "") if facts.get("hip_lld_required") else ""
    require(judge_hip_lld(value, is_file=lambda p: Path(p).is_file(), required_on=required_on),
            {"path": value})
    return {"path": value}


def _kernels(ctx: Context) -> ModuleType:
    ctx.need_module("triton")
    if not ctx.accelerated:
        msg = "no accelerator: Triton kernels need a GPU"
        raise Skip(msg)
    from stackpin_verify import triton_kernels

    return triton_kernels


def check_vector_add(ctx: Context) -> Metrics:
    kernels = _kernels(ctx)
    gen = torch.Generator(device=CPU).manual_seed(7)
    x = torch.randn(VECTOR_ELEMENTS, generator=gen).to(ctx.device)
    y = torch.randn(VECTOR_ELEMENTS, generator=gen).to(ctx.device)
    out = kernels.vector_add(x, y)
    max_abs = float((out - (x + y)).abs().max())
    metrics: Metrics = {"elements": VECTOR_ELEMENTS, "max_abs_diff": max_abs}
    # x + y in fp32 is exact-rounded on both sides: any difference is a broken kernel.
    require(None if max_abs == 0.0 else f"differs from torch by {max_abs:g}", metrics)
    metrics["median_ms"], _ = median_ms(lambda: kernels.vector_add(x, y), ctx.device)
    return metrics


def check_softmax(ctx: Context) -> Metrics:
    kernels = _kernels(ctx)
    gen = torch.Generator(device=CPU).manual_seed(8)
    x = torch.randn(*SOFTMAX_SHAPE, generator=gen).to(ctx.device)
    max_abs = float((kernels.softmax(x) - torch.softmax(x, dim=-1)).abs().max())
    metrics: Metrics = {
        "shape": list(SOFTMAX_SHAPE),
        "max_abs_diff": max_abs,
        "tolerance": SOFTMAX_TOLERANCE,
    }
    reason = None
    if not max_abs <= SOFTMAX_TOLERANCE:
        reason = f"differs from torch.softmax by {max_abs:g} > {SOFTMAX_TOLERANCE:g}"
    require(reason, metrics)
    return metrics
