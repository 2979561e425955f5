"""Timing that means something on accelerators: warm-up first, device-side events, median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from stackpin_verify.context import synchronize
from stackpin_verify.torchnames import GPU

MIN_RUNS = 5


def median_ms(
    fn: Callable[[], object],
    device: torch.device,
    *,
    runs: int = MIN_RUNS,
    warmup: int = 2,
    flush: Callable[[], object] | None = None,
) -> tuple[float, list[float]]:
    """Median and all samples in milliseconds over ``runs`` (>= 5) timed calls after warm-up
    (the first calls pay for kernel selection, JIT and allocator growth).

    ``flush`` runs before each sample, outside the timed span: the GEMM passes an L2 flush,
    as triton's do_bench does. On an H200 (issue 6) a 4096^3 bf16 product read 0.93-0.98 of
    do_bench timed alone without a flush, and 1.10-1.12 timed 10 at a time (hot L2)."""
    runs = max(runs, MIN_RUNS)
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(runs):
        if flush is not None:
            flush()
        samples.append(_time_once(fn, device))
    return statistics.median(samples), samples


def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == GPU:
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


# triton.testing.do_bench zeroes a 256 MB buffer before each call to evict the L2 cache.
L2_FLUSH_BYTES = 256 * 1024 * 1024


def l2_flush(device: torch.device) -> Callable[[], object] | None:
    """A callable that evicts the accelerator's L2 like do_bench does; None on CPU."""
    if device.type != GPU:
        return None
    buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return buffer.zero_
