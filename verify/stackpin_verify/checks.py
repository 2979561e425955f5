"""Check results and the wrapper that turns a check function into a result.

A check function returns its metrics on success, raises :class:`Skip` when it does not
apply here, and raises :class:`CheckFailed` (or any exception) when it fails. The pure
``judge_*`` functions in the level modules return a reason string or ``None`` so tests can
inject faults without running a whole level.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]
Metrics = dict[str, Any]

# Long exception texts (compiler logs, CUDA errors) would drown the summary table.
_MAX_REASON = 2000


class Skip(Exception):
    """The check does not apply on this host; the message says why."""


class CheckFailed(Exception):
    """The check ran and found a fault; carries the numbers it measured."""

    def __init__(self, reason: str, metrics: Metrics | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.metrics = dict(metrics or {})


@dataclass
class CheckResult:
    name: str
    level: int
    required: bool
    status: Status
    reason: str = ""
    metrics: Metrics = field(default_factory=dict)
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "level": self.level,
            "required": self.required,
            "status": self.status,
            "reason": self.reason,
            "metrics": self.metrics,
            "duration_s": round(self.duration_s, 6),
        }


def require(reason: str | None, metrics: Metrics | None = None) -> None:
    """Raise :class:`CheckFailed` when a judge returned a reason."""
    if reason is not None:
        raise CheckFailed(reason, metrics)


def describe_exception(exc: BaseException) -> str:
    """Type, message and the innermost frame: enough to find the failing call."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    text = f"{type(exc).__name__}: {exc}{where}"
    return text[:_MAX_REASON]


def run_check(
    name: str,
    fn: Callable[[], Metrics],
    *,
    required: bool = True,
) -> CheckResult:
    """Run one check; its level is the digit after the leading ``L`` of its name."""
    level = int(name.split(".", 1)[0][1:])
    start = time.perf_counter()
    try:
        metrics = fn()
    except Skip as exc:
        return _result(name, level, required, "skip", str(exc), {}, start)
    except CheckFailed as exc:
        return _result(name, level, required, "fail", exc.reason[:_MAX_REASON], exc.metrics, start)
    except Exception as exc:
        return _result(name, level, required, "fail", describe_exception(exc), {}, start)
    return _result(name, level, required, "pass", "", metrics, start)


def _result(
    name: str,
    level: int,
    required: bool,
    status: Status,
    reason: str,
    metrics: Metrics,
    start: float,
) -> CheckResult:
    return CheckResult(
        name=name,
        level=level,
        required=required,
        status=status,
        reason=reason,
        metrics=metrics,
        duration_s=time.perf_counter() - start,
    )
