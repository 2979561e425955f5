"""Stable versus enhanced as the reports carry it (issue 20): read a report's
``recommendation``, say how it changed between two reports, and the words the grid shows.

The suite decides (``verify/stackpin_verify/recommend.py``); this side only reads and
shows. A report without one (before issue 20, or a run that died before the levels) has
none: the grid shows nothing rather than a guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stackpin.shapes import numeric, obj, one_of, optional, text

CHOICES = ("enhanced", "stable", "either", "unsupported")
NUMBER = "enhanced_over_stable"
SHAPE = obj({
    "choice": one_of(*CHOICES),
    "line": text(limit=4096),
    "note": optional(text(limit=4096)),
    "enhanced_over_stable": optional(numeric(0, 1e9)),
}, optional_keys=("note", "enhanced_over_stable"))


@dataclass(frozen=True, kw_only=True)
class Advice:
    choice: str
    line: str
    note: str = ""
    ratio: float | None = None

    @property
    def short(self) -> str:
        """The grid cell: the choice, the deciding ratio, and a mark when a note is due."""
        ratio = f" ({self.ratio:.2f}x)" if self.ratio is not None else ""
        return self.choice + ratio + (" NOTE" if self.note else "")


def parse(report: Mapping[str, Any]) -> Advice | None:
    """The report's recommendation (already shape-checked by reports.load_report)."""
    found = report.get("recommendation")
    if not isinstance(found, dict):
        return None
    return Advice(
        choice=str(found["choice"]),
        line=" ".join(str(found["line"]).split()),
        note=" ".join(str(found.get("note") or "").split()),
        ratio=_finite(found.get(NUMBER)),
    )


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True, kw_only=True)
class Change:
    """What `verify diff` shows: the choice that changed, or the deciding ratio that moved."""

    kind: str
    before: str
    after: str
    note: str


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    old, new = parse(before), parse(after)
    if old is None and new is None:
        return []
    if old is None or new is None:
        return [Change(kind="choice", before=old.choice if old else "-",
                       after=new.choice if new else "-", note=new.line if new else "")]
    changes = []
    if old.choice != new.choice:
        changes.append(Change(kind="choice", before=old.choice, after=new.choice, note=new.line))
    if old.ratio is not None and new.ratio is not None and old.ratio != new.ratio:
        changes.append(Change(kind="metric", before=f"{old.ratio:.4g}", after=f"{new.ratio:.4g}",
                              note=f"x{new.ratio / old.ratio:.3f}"))
    return changes
