"""The device's time per call with the host queued ahead (timing.queued_ms), on a simulated
device whose clock runs with the host's, and L3.variants.attention judging by it: one call
timed alone can be the host's Python (H200, FlashAttention 4: 0.74 ms of host for 0.075 ms
of kernels), so what is judged is the device's work, and a call that never lets the host
run ahead is refused rather than read small."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "verify"))
from stackpin_verify import attn_timing, bench, recommend, timing
from stackpin_verify.checks import CheckFailed, run_check

CPU = torch.device("cpu")
NS_PER_CYCLE = 1e-6  # ms per cycle: 2^26 cycles hold the stream about 67 ms


@dataclass
class Device:
    """A stream and a host on one clock (ms). Work queues behind what is queued; the host
    pays ``host_ms`` per call; a call that syncs waits for the stream first."""

    kernel_ms: float
    host_ms: float
    syncs: bool = False
    now: float = 0.0
    free_at: float = 0.0
    holds: list[int] = field(default_factory=list)
    flushes: int = 0

    def hold(self, cycles: int) -> None:
        self.holds.append(cycles)
        self.free_at = max(self.free_at, self.now) + cycles * NS_PER_CYCLE

    def event(self) -> Any:
        return Event(self)

    def synchronize(self) -> None:
        self.now = max(self.now, self.free_at)

    def call(self) -> None:
        if self.syncs:
            self.synchronize()
        self.now += self.host_ms
        self.free_at = max(self.free_at, self.now) + self.kernel_ms

    def flush(self) -> None:
        self.flushes += 1
        self.free_at = max(self.free_at, self.now) + 0.05

    def clock(self) -> timing.DeviceClock:
        return timing.DeviceClock(hold=self.hold, event=self.event,
                                  synchronize=self.synchronize)


@dataclass
class Event:
    device: Device
    at: float | None = None

    def record(self) -> None:
        self.at = max(self.device.free_at, self.device.now)

    def query(self) -> bool:
        assert self.at is not None
        return self.at <= self.device.now

    def elapsed_time(self, end: Event) -> float:
        assert self.at is not None and end.at is not None
        return end.at - self.at


def test_queued_calls_read_the_device_work_where_a_call_alone_reads_the_host():
    device = Device(kernel_ms=0.075, host_ms=0.74)
    median, samples = timing.queued_ms(device.call, device.clock(), flush=device.flush)
    assert median == pytest.approx(0.075)
    assert len(samples) == timing.QUEUED_RUNS
    assert device.holds == [timing.HOLD_CYCLES]
    assert device.flushes == timing.QUEUED_RUNS  # before each call, outside its span
    # The same call timed alone (start, call, end, wait) spans the host's time.
    device.synchronize()
    start, end = device.event(), device.event()
    start.record()
    device.call()
    end.record()
    assert start.elapsed_time(end) == pytest.approx(0.74 + 0.075)


def test_a_host_slower_than_the_hold_is_tried_again_with_a_longer_one():
    # 25 calls of 4 ms of host: 100 ms, more than 2^26 cycles (67 ms) hold.
    device = Device(kernel_ms=0.5, host_ms=4.0)
    median, _ = timing.queued_ms(device.call, device.clock())
    assert median == pytest.approx(0.5)
    assert device.holds == [timing.HOLD_CYCLES, timing.HOLD_CYCLES * timing.HOLD_GROWTH]


def test_a_call_that_waits_on_the_device_is_refused_not_read_small():
    device = Device(kernel_ms=0.01, host_ms=0.5, syncs=True)
    with pytest.raises(timing.HostBound, match="never ran ahead of the device in 3 tries"):
        timing.queued_ms(device.call, device.clock())
    assert device.holds == [timing.HOLD_CYCLES * timing.HOLD_GROWTH**n for n in range(3)]


def _stand_in(name: str, values: dict[str, list[float]], key: str) -> bench.Timer:
    """Each side's calls in order: enhanced first, then stable, per shape."""
    def time_ms(fn: Any) -> float:
        fn()
        return values[key].pop(0)

    return bench.Timer(name, time_ms)


def _package() -> Any:
    from stackpin_verify import attn_package

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
               softmax_scale: float | None = None) -> Any:
        views = (t.transpose(1, 2) for t in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(
            *views, is_causal=causal, scale=softmax_scale).transpose(1, 2)

    return attn_package.AttentionPackage("flash-attn-4", "4.0.0b36", "flash_attn.cute",
                                         "FlashAttention 4", attend)


def test_attention_judges_the_queued_device_time_and_keeps_one_call_alone_beside_it():
    cases = [attn_timing.Shape(64, 32, True, "fwd_bwd", tokens=128)] * 2
    # Per shape: enhanced then stable. Queued: 0.8 and 0.9 of stable; alone: 1.6 and 1.5.
    values = {"queued": [0.08, 0.1, 0.45, 0.5], "eager": [0.8, 0.5, 0.9, 0.6]}
    metrics = attn_timing.compare(_package(), cases, CPU, torch.float32,
                                  _stand_in("do_bench", values, "eager"),
                                  _stand_in(bench.QUEUED, values, "queued"))
    first, second = metrics["cases"]
    assert (first["enhanced_ms"], first["stable_ms"]) == (0.08, 0.1)
    assert (first["enhanced_eager_ms"], first["stable_eager_ms"]) == (0.8, 0.5)
    assert (second["ratio"], second["eager_ratio"]) == (pytest.approx(0.9), 1.5)
    assert metrics["enhanced_over_stable_fwd_bwd"] == pytest.approx((0.8 * 0.9) ** 0.5)
    assert metrics["eager_enhanced_over_stable_fwd_bwd"] == pytest.approx((1.6 * 1.5) ** 0.5)
    assert (metrics["timer"], metrics["eager_timer"]) == (bench.QUEUED, "do_bench")
    # The recommendation shows the call-alone figure beside the judged ones.
    result = recommend.recommend([run_check(recommend.ATTENTION, lambda: metrics,
                                            required=False)],
                                 accelerated=True, variant="enhanced")
    assert result["choice"] == "enhanced"
    assert "one forward+backward call timed alone 1.55x" in result["line"]


def test_a_package_the_host_cannot_run_ahead_of_is_the_enhanced_side_failing():
    cases = [attn_timing.Shape(64, 32, True, "fwd", tokens=64)]
    values = {"eager": [0.1, 0.1]}
    sides = iter(["enhanced", "stable"])

    def refusing(fn: Any) -> float:  # the package's call syncs; SDPA's does not
        if next(sides) == "enhanced":
            msg = "the host never ran ahead of the device in 3 tries"
            raise timing.HostBound(msg)
        return 0.1

    with pytest.raises(CheckFailed, match="1 of 1 shapes failed") as failed:
        attn_timing.compare(_package(), cases, CPU, torch.float32,
                            _stand_in("do_bench", values, "eager"),
                            bench.Timer(bench.QUEUED, refusing))
    row = failed.value.metrics["cases"][0]
    assert row["failed_side"] == failed.value.metrics["failed_side"] == "enhanced"
    assert row["error"].startswith("enhanced: HostBound: the host never ran ahead")


def test_without_a_device_there_is_no_queue_to_time():
    assert bench.queued_timer(CPU) is None
