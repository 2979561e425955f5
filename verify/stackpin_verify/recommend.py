"""Stable versus enhanced: which variant is faster on this device, by how much, and the
numbers that says so (pure: check results in, the report's ``recommendation`` out).

An enhanced image holds everything the stable one does (the variants share every layer
below the attention layer) plus the attention package, so its report times both sides:
``L3.variants.attention`` (the kernels on the cell's shapes) and ``L5.variants.train_step``
(a LoRA training step with the model's attention switched). The rule:

- no device: ``unsupported: no device``; nothing is timed, no number is made up;
- a side that cannot run decides against itself (the enhanced variant whose package fails
  is no choice here); both failing is unsupported;
- otherwise the training step decides where it was measured (what users run), the
  attention forward+backward where only it was; within ``TIE_BAND`` of 1 it is ``either``;
- nothing measured (a stable image has no package; the checks were not run) is unsupported
  with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stackpin_verify.checks import CheckResult

NO_DEVICE = "no device"
NO_PACKAGE = (
    "no attention package in this image: the enhanced variant's report times both variants"
)
# Ratios this close to 1 are within run-to-run noise of do_bench medians (issue 6: L1's
# repeated runs moved 1-2 %): neither variant is faster.
TIE_BAND = 0.03
ATTENTION = "L3.variants.attention"
TRAIN_STEP = "L5.variants.train_step"
# (check, metric holding enhanced time / stable time, what a person calls it); the first
# measured one decides.
DECIDERS = (
    (TRAIN_STEP, "enhanced_over_stable", "LoRA training step"),
    (ATTENTION, "enhanced_over_stable_fwd_bwd", "attention forward+backward"),
)
SUPPORTING = (
    (ATTENTION, "enhanced_over_stable_fwd", "attention forward"),
    # One call timed alone, the host's Python and launches included (attn_timing's doc).
    (ATTENTION, "eager_enhanced_over_stable_fwd_bwd", "one forward+backward call timed alone"),
)
# Numbers copied into the recommendation beside the ratios.
TIMES = (("stable_ms", "stable step ms"), ("enhanced_ms", "enhanced step ms"))


@dataclass(frozen=True)
class Evidence:
    check: str
    metric: str
    what: str
    status: str
    reason: str
    ratio: float | None
    failed_side: str | None
    package: str | None


def gather(checks: Sequence[CheckResult]) -> list[Evidence]:
    """One entry per decider or supporting ratio whose check is in this run."""
    by_name = {c.name: c for c in checks}
    found = []
    for check, metric, what in (*DECIDERS, *SUPPORTING):
        result = by_name.get(check)
        if result is None:
            continue
        metrics = result.metrics
        found.append(
            Evidence(
                check=check,
                metric=metric,
                what=what,
                status=result.status,
                reason=result.reason.splitlines()[0] if result.reason else "",
                ratio=_ratio(metrics.get(metric)),
                failed_side=_text(metrics.get("failed_side")),
                package=_text(metrics.get("package")),
            )
        )
    return found


def _ratio(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def recommend(
    checks: Sequence[CheckResult], *, accelerated: bool, variant: str | None
) -> dict[str, Any]:
    """The report's ``recommendation``; ``variant`` is the image's (None on a bare host)."""
    if not accelerated:
        return _result("unsupported", f"unsupported: {NO_DEVICE}")
    evidence = gather(checks)
    numbers = _numbers(checks, evidence)
    package = next((e.package for e in evidence if e.package), None)
    failed = _failure(evidence)
    if failed is not None:
        choice, line = failed
        why = "its attention cannot run on this device"
        return _result(choice, line, numbers=numbers, package=package, variant=variant, why=why)
    decider = next((e for e in evidence if e.ratio is not None and _is_decider(e)), None)
    if decider is None:
        return _result("unsupported", "unsupported: " + _why_unmeasured(evidence))
    assert decider.ratio is not None
    choice = _choose(decider.ratio)
    line = _line(choice, decider, evidence, package)
    why = f"it is slower than stable on this device ({decider.what} {decider.ratio:.2f}x)"
    return _result(choice, line, numbers=numbers, package=package, variant=variant,
                   ratio=decider.ratio, decided_by=decider.check, why=why)


def _is_decider(e: Evidence) -> bool:
    return any(e.check == check and e.metric == metric for check, metric, _ in DECIDERS)


def _choose(ratio: float) -> str:
    if ratio < 1.0 - TIE_BAND:
        return "enhanced"
    if ratio > 1.0 + TIE_BAND:
        return "stable"
    return "either"


def _failure(evidence: Sequence[Evidence]) -> tuple[str, str] | None:
    """A side that failed to run: (choice, line), or None when both sides ran."""
    sides = {e.failed_side for e in evidence if e.failed_side}
    if not sides:
        return None
    first = next(e for e in evidence if e.failed_side)
    where = f"{first.check}: {first.reason}"
    if "both" in sides or sides >= {"enhanced", "stable"}:
        return "unsupported", f"unsupported: both variants failed to run ({where})"
    if sides == {"enhanced"}:
        return "stable", f"stable: the enhanced variant's attention cannot run here ({where})"
    return "enhanced", f"enhanced: the stable variant's SDPA failed here ({where})"


def _why_unmeasured(evidence: Sequence[Evidence]) -> str:
    if not evidence:
        return f"not measured ({ATTENTION} and {TRAIN_STEP} are not in this run)"
    reasons = {e.reason for e in evidence if e.status == "skip" and e.reason}
    if reasons == {NO_PACKAGE}:
        return NO_PACKAGE
    shown = "; ".join(
        f"{e.check} {e.status}" + (f": {e.reason}" if e.reason else "")
        for e in evidence
        if _is_decider(e)
    )
    return f"not measured ({shown})"


def _line(choice: str, decider: Evidence, evidence: Sequence[Evidence], package: str | None) -> str:
    assert decider.ratio is not None
    ratio = decider.ratio
    measured = f"{decider.what} {ratio:.2f}x stable's time"
    others = [
        f"{e.what} {e.ratio:.2f}x"
        for e in evidence
        if e.ratio is not None and e is not decider
    ]
    rest = f" ({', '.join(others)})" if others else ""
    pkg = package or "its attention package"
    if choice == "enhanced":
        return f"enhanced: {1 - ratio:.0%} faster here with {pkg}: {measured}{rest}"
    if choice == "stable":
        return (
            f"stable: the enhanced variant with {pkg} is {ratio - 1:.0%} slower here: "
            f"{measured}{rest}"
        )
    return (
        f"either: the enhanced variant with {pkg} is within {TIE_BAND:.0%} of stable here: "
        f"{measured}{rest}; stable has fewer parts"
    )


def _numbers(checks: Sequence[CheckResult], evidence: Sequence[Evidence]) -> dict[str, float]:
    numbers = {f"{e.check}.{e.metric}": e.ratio for e in evidence if e.ratio is not None}
    step = next((c for c in checks if c.name == TRAIN_STEP), None)
    for key, _ in TIMES:
        value = _ratio(step.metrics.get(key)) if step is not None else None
        if value is not None:
            numbers[f"{TRAIN_STEP}.{key}"] = value
    return numbers


def _result(
    choice: str,
    line: str,
    *,
    numbers: Mapping[str, float] | None = None,
    package: str | None = None,
    variant: str | None = None,
    ratio: float | None = None,
    decided_by: str | None = None,
    why: str = "",
) -> dict[str, Any]:
    return {
        "choice": choice,
        "line": line,
        "note": _note(choice, why, variant),
        "enhanced_over_stable": ratio,
        "decided_by": decided_by,
        "package": package,
        "numbers": dict(numbers or {}),
        "tie_band": TIE_BAND,
    }


def _note(choice: str, why: str, variant: str | None) -> str | None:
    """The one line an enhanced report (or a bare host with the package) shows when the
    package makes things slower or cannot run: never left to a quiet pass."""
    if choice != "stable" or variant == "stable":
        return None
    return f"NOTE: use the stable variant here: the enhanced variant is no gain, {why}"
