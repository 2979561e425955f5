"""Timing that means something on accelerators: warm-up first, device-side events, median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
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


class HostBound(RuntimeError):
    """The timed call never let the host run ahead of the device (it waits on the device,
    or computes on the host): its device time cannot be read apart from the host's."""


@dataclass(frozen=True)
class DeviceClock:
    """What queued_ms needs from the device, apart so its rule is testable without one."""

    hold: Callable[[int], object]  # keep the stream busy for about this many cycles
    event: Callable[[], Any]
    synchronize: Callable[[], object]


def cuda_clock(device: torch.device) -> DeviceClock:
    return DeviceClock(hold=torch.cuda._sleep, event=_event,
                       synchronize=lambda: synchronize(device))


# A spin of 2^26 cycles (about 35 ms at an H200's clock) outlasts the host's queueing of
# QUEUED_RUNS calls of under a millisecond of Python each; a longer host is tried again
# with a hold HOLD_GROWTH times longer, HOLD_TRIES times in all.
HOLD_CYCLES = 2**26
HOLD_GROWTH = 8
HOLD_TRIES = 3
QUEUED_RUNS = 25


def queued_ms(
    fn: Callable[[], object],
    clock: DeviceClock,
    *,
    runs: int = QUEUED_RUNS,
    warmup: int = 2,
    flush: Callable[[], object] | None = None,
) -> tuple[float, list[float]]:
    """The device's time per call when the host runs ahead of it, as it does in a training
    step: the stream is held by a spin while the host queues every call (flush, start
    event, call, end event), so each sample spans the call's device work alone. One call
    timed by itself (median_ms, do_bench) also spans the host's Python, dispatch and
    launches, which at small sizes is most of it (H200, FlashAttention 4 fwd+bwd at
    b4 s512 hd128: 0.74 ms of host for 0.075 ms of kernels).

    The spin must still be running when the host has queued the last call, or a sample
    could hold host time: that is checked, and a call that never lets the host ahead (it
    waits on the device, or computes on the host) raises HostBound instead of reading small.
    """
    runs = max(runs, MIN_RUNS)
    for _ in range(warmup):
        fn()
    clock.synchronize()
    cycles = HOLD_CYCLES
    for _ in range(HOLD_TRIES):
        clock.hold(cycles)
        spans = []
        for _ in range(runs):
            if flush is not None:
                flush()
            start, end = clock.event(), clock.event()
            start.record()
            fn()
            end.record()
            spans.append((start, end))
        ran_ahead = not spans[0][0].query()  # the first call has not begun: still held
        clock.synchronize()
        if ran_ahead:
            samples = [float(start.elapsed_time(end)) for start, end in spans]
            return statistics.median(samples), samples
        cycles *= HOLD_GROWTH
    msg = (f"the host never ran ahead of the device in {HOLD_TRIES} tries (up to "
           f"{cycles // HOLD_GROWTH} cycles held): the call waits on the device or works "
           "on the host")
    raise HostBound(msg)
