"""Timing that means something on accelerators: warm-up first, device-side events, median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from stackpin_verify.context import synchronize

MIN_RUNS = 5


def median_ms(
    fn: Callable[[], object],
    device: torch.device,
    *,
    runs: int = MIN_RUNS,
    warmup: int = 2,
) -> tuple[float, list[float]]:
    """Median and all samples in milliseconds over ``runs`` (>= 5) timed calls after warm-up
    (the first calls pay for kernel selection, JIT and allocator growth)."""
    runs = max(runs, MIN_RUNS)
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = [_time_once(fn, device) for _ in range(runs)]
    return statistics.median(samples), samples


def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        start = _event()
        end = _event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def _event() -> Any:
    # torch.cuda.Event is untyped in some torch releases; HIP builds provide it too.
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
