"""Stable versus enhanced (issue 20): the decision rule, the timing plumbing on CPU with a
stand-in attention package, and the report lines a person reads."""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import verify_helpers
from tests.golden_files import assert_golden

from stackpin_verify import attn_package, attn_timing, bench, recommend, report, schema, step_timing
from stackpin_verify.checks import CheckFailed, CheckResult, Skip, run_check

FA4 = "flash-attn-4 4.0.0b36 (FlashAttention 4)"
CPU = torch.device("cpu")


def _measured(name: str, metrics: dict[str, Any], *, slower_reason: str = "") -> CheckResult:
    """A timing check as the suite records it: pass, or an optional fail with its numbers."""
    status = "fail" if slower_reason else "pass"
    return CheckResult(name=name, level=int(name[1]), required=False, status=status,
                       reason=slower_reason, metrics={"package": FA4, **metrics})


def _step(ratio: float, **extra: Any) -> CheckResult:
    metrics = {"enhanced_over_stable": ratio, "stable_ms": 10.0, "enhanced_ms": 10.0 * ratio}
    reason = "enhanced is slower here" if ratio > 1 + recommend.TIE_BAND else ""
    return _measured(recommend.TRAIN_STEP, {**metrics, **extra}, slower_reason=reason)


def _attention(fwd_bwd: float, fwd: float = 0.9) -> CheckResult:
    reason = "enhanced is slower here" if fwd_bwd > 1 + recommend.TIE_BAND else ""
    metrics = {"enhanced_over_stable_fwd_bwd": fwd_bwd, "enhanced_over_stable_fwd": fwd}
    return _measured(recommend.ATTENTION, metrics, slower_reason=reason)


def _failed(name: str, side: str, reason: str) -> CheckResult:
    return CheckResult(name=name, level=int(name[1]), required=False, status="fail",
                       reason=reason, metrics={"failed_side": side, "package": FA4})


def _skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name=name, level=int(name[1]), required=False, status="skip", reason=reason)


def _decide(*checks: CheckResult, variant: str | None = "enhanced") -> dict[str, Any]:
    return recommend.recommend(list(checks), accelerated=True, variant=variant)


# --- the decision rule -----------------------------------------------------------------


def test_no_device_is_unsupported_with_no_number_even_when_timings_are_present():
    found = recommend.recommend([_step(0.5), _attention(0.5)], accelerated=False,
                                variant="enhanced")
    assert found["choice"] == "unsupported"
    assert found["line"] == "unsupported: no device"
    assert found["enhanced_over_stable"] is None
    assert found["numbers"] == {}
    assert found["note"] is None


def test_faster_training_step_recommends_enhanced_with_the_numbers():
    found = _decide(_step(0.88), _attention(0.85, fwd=0.9))
    assert found["choice"] == "enhanced"
    assert found["decided_by"] == recommend.TRAIN_STEP
    assert found["enhanced_over_stable"] == pytest.approx(0.88)
    assert found["line"] == (
        f"enhanced: 12% faster here with {FA4}: LoRA training step 0.88x stable's time "
        "(attention forward+backward 0.85x, attention forward 0.90x)"
    )
    assert found["numbers"] == {
        "L5.variants.train_step.enhanced_over_stable": pytest.approx(0.88),
        "L3.variants.attention.enhanced_over_stable_fwd_bwd": 0.85,
        "L3.variants.attention.enhanced_over_stable_fwd": 0.9,
        "L5.variants.train_step.stable_ms": 10.0,
        "L5.variants.train_step.enhanced_ms": pytest.approx(8.8),
    }
    assert found["note"] is None


def test_slower_enhanced_recommends_stable_and_the_enhanced_report_carries_a_note():
    found = _decide(_step(1.3), _attention(1.41, fwd=1.28))
    assert found["choice"] == "stable"
    assert found["line"] == (
        f"stable: the enhanced variant with {FA4} is 30% slower here: LoRA training step 1.30x "
        "stable's time (attention forward+backward 1.41x, attention forward 1.28x)"
    )
    assert found["note"] == (
        "NOTE: use the stable variant here: the enhanced variant is no gain, it is slower than "
        "stable on this device (LoRA training step 1.30x)"
    )


def test_a_stable_image_gets_no_note():
    assert _decide(_step(1.3), variant="stable")["note"] is None


@pytest.mark.parametrize(
    ("ratio", "choice"),
    [(0.9699, "enhanced"), (0.97, "either"), (1.0, "either"), (1.03, "either"),
     (1.0301, "stable")],
)
def test_ties_within_the_band_are_either(ratio, choice):
    found = _decide(_step(ratio))
    assert found["choice"] == choice
    if choice == "either":
        assert found["line"].startswith(
            f"either: the enhanced variant with {FA4} is within 3% of stable here"
        )
        assert found["note"] is None


def test_the_training_step_decides_over_the_kernels_when_they_disagree():
    found = _decide(_step(1.2), _attention(0.8))
    assert found["choice"] == "stable"
    assert found["decided_by"] == recommend.TRAIN_STEP


def test_attention_decides_when_the_step_was_not_measured():
    found = _decide(_attention(0.85), _skipped(recommend.TRAIN_STEP, "peft is not installed"))
    assert found["choice"] == "enhanced"
    assert found["decided_by"] == recommend.ATTENTION
    assert found["enhanced_over_stable"] == 0.85


def test_nothing_measured_is_unsupported_and_says_why():
    absent = _decide()
    assert absent["choice"] == "unsupported"
    assert absent["line"] == (
        "unsupported: not measured (L3.variants.attention and L5.variants.train_step are "
        "not in this run)"
    )
    stable_image = _decide(_skipped(recommend.ATTENTION, recommend.NO_PACKAGE),
                           _skipped(recommend.TRAIN_STEP, recommend.NO_PACKAGE), variant="stable")
    assert stable_image["line"] == "unsupported: " + recommend.NO_PACKAGE
    other = _decide(_skipped(recommend.TRAIN_STEP, "peft is not installed"))
    assert other["line"] == (
        "unsupported: not measured (L5.variants.train_step skip: peft is not installed)"
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0, True, "0.9", None])
def test_a_ratio_that_is_no_positive_number_counts_as_missing(bad):
    found = _decide(_measured(recommend.TRAIN_STEP, {"enhanced_over_stable": bad}))
    assert found["choice"] == "unsupported"
    assert found["enhanced_over_stable"] is None


def test_enhanced_failing_recommends_stable_even_when_the_other_check_was_faster():
    broken = _failed(recommend.ATTENTION, "enhanced", "2 of 16 shapes failed; s4096: boom")
    found = _decide(broken, _step(0.8))
    assert found["choice"] == "stable"
    assert found["line"] == (
        "stable: the enhanced variant's attention cannot run here "
        "(L3.variants.attention: 2 of 16 shapes failed; s4096: boom)"
    )
    assert found["note"] == (
        "NOTE: use the stable variant here: the enhanced variant is no gain, its attention "
        "cannot run on this device"
    )


def test_stable_failing_recommends_enhanced_and_both_failing_is_unsupported():
    stable = _decide(_failed(recommend.TRAIN_STEP, "stable", "the training step failed"))
    assert stable["choice"] == "enhanced"
    assert stable["line"].startswith("enhanced: the stable variant's SDPA failed here")
    both = _decide(_failed(recommend.ATTENTION, "enhanced", "x"),
                   _failed(recommend.TRAIN_STEP, "stable", "y"))
    assert both["choice"] == "unsupported"
    assert _decide(_failed(recommend.TRAIN_STEP, "both", "z"))["choice"] == "unsupported"


# --- report, summary and schema ---------------------------------------------------------


def _report(recommendation: dict[str, Any] | None) -> dict[str, Any]:
    import datetime

    return report.build_report(
        checks=[_attention(1.41, fwd=1.28), _step(1.3)],
        host={"hostname": "h200", "machine": "x86_64", "python": "3.12.3", "cpu_count": 16,
              "cgroup_cpus": None, "cgroup_memory_bytes": None},
        image=verify_helpers.image_info(variant="enhanced", attention="flash_attn",
                                        platform="cuda"),
        backend="cuda",
        versions={"python": "3.12.3", "torch": "2.11.0+cu130"},
        devices=[],
        duration_s=3.0,
        created=datetime.datetime(2026, 12, 2, 1, 0, tzinfo=datetime.timezone.utc),
        recommendation=recommendation,
    )


def test_the_summary_ends_with_the_recommendation_and_the_note():
    found = _decide(_attention(1.41, fwd=1.28), _step(1.3))
    table = report.summary_table(_report(found)).splitlines()
    assert table[-2] == (
        f"recommendation: stable: the enhanced variant with {FA4} is 30% slower here: LoRA "
        "training step 1.30x stable's time (attention forward+backward 1.41x, attention "
        "forward 1.28x)"
    )
    assert table[-1] == found["note"]
    assert table[-1].startswith("NOTE: use the stable variant here")
    assert any("FAIL (optional)" in line and "L3.variants.attention" in line for line in table)


def test_golden_summary_of_an_enhanced_report_that_is_slower():
    # The hand-written H200 fixture the grid tests use (its recommendation computed by
    # recommend.recommend from its checks).
    path = verify_helpers.ROOT / "tests/unit/fixtures/reports/cuda-h200-enhanced-fa2.json"
    fixture = json.loads(path.read_text(encoding="utf-8"))
    assert fixture["recommendation"] == recommend.recommend(
        [CheckResult(**c) for c in fixture["checks"]], accelerated=True, variant="enhanced"
    )
    assert_golden("verify/summary-enhanced-slower.txt", report.summary_table(fixture) + "\n")


def test_reports_with_every_kind_of_recommendation_match_the_schema():
    kinds = [_decide(_step(0.8)), _decide(_step(1.3)), _decide(_step(1.0)), _decide(),
             recommend.recommend([], accelerated=False, variant=None)]
    for found in kinds:
        assert schema.validate(_report(found), schema.load_schema()) == []
    bad = _report({**kinds[0], "choice": "faster"})
    assert any("choice" in e for e in schema.validate(bad, schema.load_schema()))
    assert schema.validate(_report(None), schema.load_schema()) == []
    fa4_image = _report(kinds[0])
    fa4_image["image"]["attention"] = "flash_attn.cute"  # what render writes for flash-attn-4
    assert schema.validate(fa4_image, schema.load_schema()) == []


# --- finding the package ----------------------------------------------------------------


def _dists(*installed: str) -> Any:
    def version(dist: str) -> str:
        if dist not in installed:
            raise importlib.metadata.PackageNotFoundError(dist)
        return {"flash-attn-4": "4.0.0b36", "flash-attn": "2.8.3.post2"}[dist]

    return version


class _Module:
    def __init__(self, name: str) -> None:
        self.name = name

    def flash_attn_func(self) -> str:
        return self.name


def test_discover_prefers_fa4_by_distribution_and_falls_back_to_fa2():
    both = attn_package.discover(_Module, _dists("flash-attn", "flash-attn-4"))
    assert both is not None and both.module == "flash_attn.cute"
    assert both.label == FA4
    fa2 = attn_package.discover(_Module, _dists("flash-attn"))
    assert fa2 is not None and fa2.func() == "flash_attn" and fa2.title == "FlashAttention 2"
    assert attn_package.discover(_Module, _dists()) is None


def test_an_installed_package_that_does_not_import_is_broken():
    def no_import(name: str) -> Any:
        msg = "libcudart.so.13: cannot open shared object file"
        raise ImportError(msg)

    with pytest.raises(attn_package.PackageBroken, match=r"flash-attn 2\.8\.3\.post2 .*libcudart"):
        attn_package.discover(no_import, _dists("flash-attn"))


def test_for_timing_skips_a_stable_image_and_fails_an_enhanced_one_without_its_package():
    with pytest.raises(Skip, match="no attention package"):
        attn_package.for_timing("sdpa", recommend.NO_PACKAGE, find=lambda: None)
    with pytest.raises(CheckFailed, match=r"attention is flash_attn\.cute but no") as failed:
        attn_package.for_timing("flash_attn.cute", recommend.NO_PACKAGE, find=lambda: None)
    assert failed.value.metrics == {"failed_side": "enhanced"}


def test_for_timing_fails_when_the_installed_package_is_not_the_declared_one():
    fa2 = attn_package.AttentionPackage("flash-attn", "2.8.3.post2", "flash_attn",
                                        "FlashAttention 2", _Module("flash_attn").flash_attn_func)
    with pytest.raises(CheckFailed, match=r"is flash_attn\.cute but the installed one is "
                                          r"flash-attn 2\.8\.3\.post2"):
        attn_package.for_timing("flash_attn.cute", recommend.NO_PACKAGE, find=lambda: fa2)
    assert attn_package.for_timing("flash_attn", recommend.NO_PACKAGE, find=lambda: fa2) is fa2
    assert attn_package.for_timing("", recommend.NO_PACKAGE, find=lambda: fa2) is fa2


def test_attend_takes_the_output_out_of_fa4s_tuple():
    q = torch.ones(1, 2, 1, 4)
    fa4 = attn_package.AttentionPackage("d", "1", "m", "t", lambda *a, **k: (q * 2, q))
    assert torch.equal(fa4.attend(q, q, q, causal=True), q * 2)


# --- the timing plumbing, on CPU --------------------------------------------------------


class Recorder:
    """A stand-in attention package: SDPA on [B, S, H, D], recording every call; ``scale``
    makes it wrong, ``fail`` makes it raise."""

    def __init__(self, *, scale: float = 1.0, fail: bool = False) -> None:
        self.calls: list[tuple[tuple[int, ...], bool, bool]] = []
        self.scale, self.fail = scale, fail

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 softmax_scale: float | None = None) -> tuple[torch.Tensor, None]:
        self.calls.append((tuple(q.shape), causal, q.requires_grad))
        if self.fail:
            msg = "no kernel image is available for execution on the device"
            raise RuntimeError(msg)
        views = [t.transpose(1, 2) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*views, is_causal=causal, scale=softmax_scale,
                                             enable_gqa=True)
        return out.transpose(1, 2) * self.scale, None

    def package(self) -> attn_package.AttentionPackage:
        return attn_package.AttentionPackage("flash-attn-4", "4.0.0b36", "flash_attn.cute",
                                             "FlashAttention 4", self)


def _timer(values: Iterator[float]) -> bench.Timer:
    """Runs the timed function once (so its plumbing executes) and returns the next value."""
    def time_ms(fn: Any) -> float:
        fn()
        return next(values)

    return bench.Timer("stand-in", time_ms)


def test_the_shapes_are_the_declared_workload_studio_trains_and_serves_at():
    """Judged on Studio's defaults (workload.json), not on shapes picked by which kernel
    wins: training batches fwd+bwd, prefills fwd, all causal."""
    from stackpin_verify import workload

    found = attn_timing.shapes()
    declared = workload.declared()["shapes"]
    assert [(s.batch, s.seqlen, s.head_dim, s.mode) for s in found] == [
        (d["batch"], d["seqlen"], d["head_dim"], d["mode"]) for d in declared]
    assert all(s.causal and s.heads == 16 for s in found)
    # Studio 2026.10.9's Train defaults (batch 4, context 2048) and chat context (4096).
    assert (4, 2048, 128, "fwd_bwd") in {(s.batch, s.seqlen, s.head_dim, s.mode) for s in found}
    assert (1, 4096, 128, "fwd") in {(s.batch, s.seqlen, s.head_dim, s.mode) for s in found}
    assert {s.mode for s in found} == {"fwd", "fwd_bwd"}
    # The LoRA step is timed on the first training batch, with the same attention geometry.
    model = step_timing.SpeedModel.declared()
    first = workload.train_shape()
    assert (model.batch, model.seqlen, model.heads, model.hidden // model.heads) == (
        first.batch, first.seqlen, first.heads, first.head_dim)


@pytest.mark.parametrize("entry", [
    {"use": "train", "mode": "fwd"}, {"use": "serve", "mode": "fwd_bwd"},
    {"use": "decode", "mode": "fwd"}, {"batch": 0}, {"seqlen": -1},
])
def test_a_workload_shape_that_contradicts_itself_is_refused(entry):
    from stackpin_verify import workload

    good = {"use": "train", "batch": 4, "seqlen": 2048, "head_dim": 128, "mode": "fwd_bwd",
            "why": "x"}
    with pytest.raises(ValueError, match="workload shape"):
        workload.attention_shapes({"heads": 16, "shapes": [{**good, **entry}]})


def test_timing_calls_the_package_with_its_layout_mask_and_gradients():
    recorder = Recorder()
    cases = [attn_timing.Shape(64, 32, True, "fwd", tokens=128),
             attn_timing.Shape(64, 32, False, "fwd_bwd", tokens=128)]
    # enhanced then stable for each shape: 0.5 ms against 1 ms, then 1.5 against 2.
    metrics = attn_timing.compare(recorder.package(), cases, CPU, torch.float32,
                                  _timer(iter([0.5, 1.0, 1.5, 2.0])))
    # A first call outside the timer, then the timed one; [B, S, H, D], mask, grad as asked.
    assert recorder.calls == [((2, 64, 16, 32), True, False)] * 2 + [
        ((2, 64, 16, 32), False, True)] * 2
    fwd, fwd_bwd = metrics["cases"]
    assert (fwd["enhanced_ms"], fwd["stable_ms"], fwd["ratio"]) == (0.5, 1.0, 0.5)
    assert fwd_bwd["ratio"] == 0.75
    assert fwd["max_abs_diff"] < 1e-5
    assert metrics["enhanced_over_stable_fwd"] == 0.5
    assert metrics["enhanced_over_stable_fwd_bwd"] == 0.75
    assert metrics["timer"] == "stand-in"


def test_a_slower_package_fails_the_optional_check_with_the_numbers():
    cases = [attn_timing.Shape(64, 32, True, "fwd_bwd", tokens=64)] * 2
    with pytest.raises(CheckFailed, match=r"enhanced is slower here: .* takes 1\.41x") as failed:
        attn_timing.compare(Recorder().package(), cases, CPU, torch.float32,
                            _timer(iter([2.0, 1.0, 1.0, 1.0])))
    assert failed.value.metrics["enhanced_over_stable_fwd_bwd"] == pytest.approx(2**0.5)
    assert "failed_side" not in failed.value.metrics


@pytest.mark.parametrize(("recorder", "error"), [
    (Recorder(scale=1.5), "output differs from SDPA's"),
    (Recorder(fail=True), "enhanced: RuntimeError: no kernel image"),
])
def test_a_wrong_or_failing_package_is_the_enhanced_side_failing(recorder, error):
    cases = [attn_timing.Shape(64, 32, True, "fwd", tokens=64)]
    with pytest.raises(CheckFailed, match="1 of 1 shapes failed") as failed:
        attn_timing.compare(recorder.package(), cases, CPU, torch.float32,
                            _timer(iter([1.0] * 4)))
    assert failed.value.metrics["failed_side"] == "enhanced"
    assert error in failed.value.metrics["cases"][0]["error"]
    assert recommend.recommend(
        [run_check(recommend.ATTENTION, lambda: _raise(failed.value), required=False)],
        accelerated=True, variant="enhanced",
    )["choice"] == "stable"


def test_both_sides_failing_keeps_both_errors():
    def broken_sdpa(*args: Any, **kwargs: Any) -> torch.Tensor:
        msg = "no kernel image is available (SDPA)"
        raise RuntimeError(msg)

    cases = [attn_timing.Shape(64, 32, True, "fwd", tokens=64)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attn_timing, "sdpa", broken_sdpa)
        with pytest.raises(CheckFailed) as failed:
            attn_timing.compare(Recorder(fail=True).package(), cases, CPU, torch.float32,
                                _timer(iter([1.0] * 4)))
    row = failed.value.metrics["cases"][0]
    assert failed.value.metrics["failed_side"] == row["failed_side"] == "both"
    assert row["error"].startswith("enhanced: RuntimeError: no kernel image")
    assert "; stable: RuntimeError: no kernel image is available (SDPA)" in row["error"]


def _raise(exc: Exception) -> dict[str, Any]:
    raise exc


def test_without_a_device_neither_check_times_anything():
    ctx = verify_helpers.cpu_context(verify_helpers.image_info(attention="flash_attn"))
    for check in (attn_timing.check, step_timing.check):
        with pytest.raises(Skip, match=r"^no device$"):
            check(ctx)


def test_the_cpu_timer_is_not_called_do_bench_and_runs_the_function():
    timer = bench.select_timer(CPU)
    assert timer.name == "wall clock"
    calls = []
    assert timer.time_ms(lambda: calls.append(1)) >= 0
    assert len(calls) >= 5


def test_do_bench_is_the_timer_wherever_triton_offers_it():
    seen: list[torch.device] = []

    def offered(device: torch.device) -> Any:
        seen.append(device)
        return lambda fn: 0.25

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench.level1, "triton_bench", offered)
        timer = bench.select_timer(CPU)
    assert (timer.name, timer.time_ms(lambda: None), seen) == (
        "triton.testing.do_bench", 0.25, [CPU])


TINY = step_timing.SpeedModel(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=1,
                              vocab=64, batch=2, seqlen=16)


def _in_rounds(stable: float, enhanced: float) -> Iterator[float]:
    """Timer values in the order step_timing.paired asks: the sides swap each round."""
    for round_ in range(step_timing.ROUNDS):
        yield from (stable, enhanced) if round_ % 2 == 0 else (enhanced, stable)


def test_the_training_step_runs_through_the_package_with_the_same_first_loss():
    recorder = Recorder()
    metrics = step_timing.compare(recorder.package(), TINY, CPU, torch.float32,
                                  _timer(_in_rounds(4.0, 3.0)))
    assert metrics["logits_mean_rel_diff"] < 1e-6
    assert metrics["enhanced_over_stable"] == 0.75
    assert metrics["round_ratios"] == [0.75] * step_timing.ROUNDS
    # One layer: the logits, the first step, then one timed step a round, through the
    # package, causal.
    assert recorder.calls == [((2, 16, 4, 16), True, False)] + [
        ((2, 16, 4, 16), True, True)] * (1 + step_timing.ROUNDS)
    assert metrics["model"]["head_dim"] == 16


def test_the_sides_are_timed_in_turns_so_drift_cannot_pass_for_a_gain():
    recorder = Recorder()
    seen: list[str] = []
    clock = iter(range(1, 100))

    def drifting(fn: Any) -> float:
        before = len(recorder.calls)
        fn()
        seen.append("enhanced" if len(recorder.calls) > before else "stable")
        return float(next(clock))  # every call slower than the last: the machine warms

    metrics = step_timing.compare(recorder.package(), TINY, CPU, torch.float32,
                                  bench.Timer("drifting", drifting))
    assert seen == ["stable", "enhanced", "enhanced", "stable"] * 3
    # Stable first every time would read 7-12 against 1-6: enhanced "twice as slow"; in
    # turns the drift adds the same to both totals (39 ms each).
    assert metrics["round_ratios"] == [2 / 1, 3 / 4, 6 / 5, 7 / 8, 10 / 9, 11 / 12]
    assert metrics["enhanced_over_stable"] == 1.0
    assert metrics["stable_ms"] == metrics["enhanced_ms"] == 39 / 6


class IgnoresMask(Recorder):
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                 softmax_scale: float | None = None) -> tuple[torch.Tensor, None]:
        return super().__call__(q, k, v, causal=False, softmax_scale=softmax_scale)


@pytest.mark.parametrize("recorder", [Recorder(scale=1.5), IgnoresMask()])
def test_a_package_computing_wrong_attention_fails_the_step_on_the_enhanced_side(recorder):
    # The loss alone would not tell: at initialisation it sits near ln(vocab) regardless.
    with pytest.raises(CheckFailed, match=r"logits with .* differ from SDPA's") as failed:
        step_timing.compare(recorder.package(), TINY, CPU, torch.float32,
                            _timer(_in_rounds(1.0, 1.0)))
    assert failed.value.metrics["failed_side"] == "enhanced"


def test_a_slower_step_fails_the_optional_check_and_a_failing_one_names_its_side():
    with pytest.raises(CheckFailed, match=r"enhanced is slower here: .*\(1\.50x\)"):
        step_timing.compare(Recorder().package(), TINY, CPU, torch.float32,
                            _timer(_in_rounds(2.0, 3.0)))
    with pytest.raises(CheckFailed, match="enhanced: RuntimeError: no kernel image") as failed:
        step_timing.compare(Recorder(fail=True).package(), TINY, CPU, torch.float32,
                            _timer(iter([])))  # nothing is timed when a side failed
    assert failed.value.metrics["failed_side"] == "enhanced"


def test_the_registered_attention_refuses_a_padding_mask():
    forward = step_timing.attention_function(Recorder().package())
    q = torch.ones(1, 2, 4, 8)
    with pytest.raises(ValueError, match="no padding"):
        forward(torch.nn.Module(), q, q, q, torch.ones(1, 1, 4, 4))
