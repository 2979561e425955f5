"""One timer for the stable-versus-enhanced comparison: triton's do_bench where triton and a
device are present (the harness the issue-20 figures were taken with), else CUDA events the
way do_bench uses them (warm-up, L2 flush before each sample, median; timing.median_ms)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from stackpin_verify import level1
from stackpin_verify.timing import cuda_clock, l2_flush, median_ms, queued_ms
from stackpin_verify.torchnames import GPU


@dataclass(frozen=True)
class Timer:
    name: str  # "triton.testing.do_bench" | "cuda events"
    time_ms: Callable[[Callable[[], object]], float]


def select_timer(device: torch.device) -> Timer:
    do_bench = level1.triton_bench(device)
    if do_bench is not None:
        return Timer("triton.testing.do_bench", do_bench)
    return Timer("cuda events" if device.type == GPU else "wall clock", _events(device))


QUEUED = "device time, the host queued ahead (cuda events)"


def queued_timer(device: torch.device) -> Timer | None:
    """The device's own time per call (timing.queued_ms), with do_bench's L2 flush before
    each call; None without an accelerator, where there is no queue to run ahead of."""
    if device.type != GPU:
        return None
    clock = cuda_clock(device)
    flush = l2_flush(device)
    return Timer(QUEUED, lambda fn: queued_ms(fn, clock, flush=flush)[0])


def _events(device: torch.device) -> Callable[[Callable[[], object]], float]:
    flush = l2_flush(device)

    def time_ms(fn: Callable[[], object]) -> float:
        estimate, _ = median_ms(fn, device)
        warmup, runs = level1.accel_runs(estimate)
        median, _ = median_ms(fn, device, runs=runs, warmup=warmup, flush=flush)
        return median

    return time_ms
