"""What got worse: two reports (`stackpin verify diff`), or a grid against its baseline.

Pure: report documents and grid models in (``stackpin.reports`` reads them), plain
changes out; a check that got worse, or vanished, is marked, never dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from stackpin import recommendation
from stackpin.errors import VerificationError
from stackpin.reports import (
    GRID_SCHEMA,
    MISSING,
    NUMBERS,
    Change,
    Check,
    Grid,
    Row,
    columns,
    fmt_number,
    got_worse,
)
from stackpin.shapes import array, conform, mapping, numeric, obj, optional, text
from stackpin.untrusted import parse_json, shown

# --- a grid against its baseline ----------------------------------------------------


_GRID = obj({
    "schema": text(limit=64),
    "rows": array(obj({
        "id": text(limit=512),
        "checks": mapping(obj({"status": text(limit=64)}), limit=100_000),
        "numbers": mapping(optional(numeric(-1e300, 1e300)), limit=4096),
    }, optional_keys=("checks", "numbers")), limit=100_000),
}, optional_keys=("rows",))


def parse_baseline(source: str, data: str | bytes) -> dict[str, dict[str, Any]]:
    """A previous grid.json as {row id: {"checks": {name: status}, "numbers": {...}}}."""
    document = parse_json(data.encode() if isinstance(data, str) else data,
                          what=f"{shown(source)}", error=VerificationError)
    if not isinstance(document, dict) or document.get("schema") != GRID_SCHEMA:
        msg = (f"{shown(source)}: not a stackpin grid (schema {GRID_SCHEMA}); rebuild it with "
               "'report grid'")
        raise VerificationError(msg)
    conform(_GRID, document, lambda problem: VerificationError(
        f"{shown(source)}: {problem}; --baseline takes a 'report grid' output dir"))
    rows: dict[str, dict[str, Any]] = {}
    for row in document.get("rows", []):
        checks = {n: c.get("status", MISSING) for n, c in row.get("checks", {}).items()}
        rows[row["id"]] = {"checks": checks, "numbers": dict(row.get("numbers", {}))}
    return rows


def compare(grid: Grid, baseline: Mapping[str, Mapping[str, Any]], *, source: str,
            threshold: float) -> Grid:
    """Mark every check that got worse and every key number that moved past the threshold."""
    changes: list[Change] = []
    rows: list[Row] = []
    for row in grid.rows:
        old = baseline.get(row.id)
        if old is None:
            rows.append(row)
            continue
        row, status_changes = _compare_checks(row, old["checks"])
        changes += status_changes
        changes += _compare_numbers(row, old["numbers"], threshold)
        rows.append(row)
    return replace(
        grid,
        rows=tuple(rows),
        columns=columns(rows),
        changes=tuple(changes),
        baseline=source,
        threshold=threshold,
    )


def _compare_checks(row: Row, old: Mapping[str, str]) -> tuple[Row, list[Change]]:
    checks = dict(row.checks)
    changes: list[Change] = []
    for name, before in sorted(old.items()):
        now = checks.get(name)
        after = now.status if now else MISSING
        if before == MISSING or not got_worse(before, after):
            continue
        if now is None:
            # Keep the vanished check visible: a dropped check can hide a failure.
            level = int(name[1]) if name[:1] == "L" and name[1:2].isdigit() else 0
            now = Check(name=name, level=level, required=True, status=MISSING,
                        reason="check absent from this report")
        checks[name] = replace(now, was=before)
        changes.append(Change(row=row.id, name=name, kind="status", old=before, new=after,
                              worse=True, detail=f"{before} -> {after}"))
    return replace(row, checks=checks), changes


def _compare_numbers(row: Row, old: Mapping[str, Any], threshold: float) -> list[Change]:
    changes: list[Change] = []
    for key, (_, better) in NUMBERS.items():
        before, after = old.get(key), row.numbers.get(key)
        if not isinstance(before, (int, float)):
            continue
        if after is None:
            changes.append(Change(row=row.id, name=key, kind="number", old=fmt_number(before),
                                  new=MISSING, worse=True, detail="no longer measured"))
            continue
        moved = _relative(before, after)
        if moved <= threshold:
            continue
        worse = (after - before) * better < 0
        moved_by = f"{_pct(after, before)}; threshold {threshold:.0%}"
        detail = f"{fmt_number(before)} -> {fmt_number(after)} ({moved_by})"
        changes.append(Change(row=row.id, name=key, kind="number", old=fmt_number(before),
                              new=fmt_number(after), worse=worse, detail=detail))
    return changes


def _relative(before: float, after: float) -> float:
    if before == 0:
        return 0.0 if after == 0 else math.inf
    return abs(after - before) / abs(before)


def _pct(after: float, before: float) -> str:
    return "new" if before == 0 else f"{(after - before) / abs(before):+.1%}"


# --- two reports: `stackpin verify diff` ----------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Difference:
    """One line of `verify diff`: a status, version or rate that differs."""

    kind: str  # "status", "version", "metric", "added", "removed"
    name: str
    before: str
    after: str
    note: str = ""

    def __str__(self) -> str:
        note = f" ({self.note})" if self.note else ""
        return f"{self.kind:8} {self.name}: {self.before} -> {self.after}{note}"


_RATE_METRICS = (
    "tflops",
    "speedup_vs_sdpa_default",
    "speedup_vs_sdpa_math",
    "speedup_vs_sdpa",
    "tokens_per_s",
    "enhanced_over_stable",
    "enhanced_over_stable_fwd_bwd",
    "enhanced_over_stable_fwd",
)


def diff_reports(before: dict[str, Any], after: dict[str, Any]) -> list[Difference]:
    """What changed between two reports: statuses, versions, throughput ratios."""
    changes: list[Difference] = []
    for name in sorted(set(before.get("versions", {})) | set(after.get("versions", {}))):
        old = str(before.get("versions", {}).get(name, "-"))
        new = str(after.get("versions", {}).get(name, "-"))
        if old != new:
            changes.append(Difference(kind="version", name=name, before=old, after=new))
    old_checks = {c["name"]: c for c in before.get("checks", [])}
    new_checks = {c["name"]: c for c in after.get("checks", [])}
    for name in sorted(set(old_checks) | set(new_checks)):
        changes += _check_changes(name, old_checks.get(name), new_checks.get(name))
    for change in recommendation.diff(before, after):
        name = "recommendation" + ("" if change.kind == "choice" else f".{recommendation.NUMBER}")
        changes.append(Difference(kind=change.kind, name=name, before=change.before,
                                  after=change.after, note=change.note))
    return changes


def _check_changes(
    name: str, old: dict[str, Any] | None, new: dict[str, Any] | None
) -> list[Difference]:
    if old is None or new is None:
        kind = "added" if old is None else "removed"
        status = (new or old or {}).get("status", "?")
        return [Difference(kind=kind, name=name, before="-" if old is None else status,
                       after="-" if new is None else status)]
    found = []
    if old["status"] != new["status"]:
        worse = got_worse(old["status"], new["status"])
        found.append(Difference(kind="status", name=name, before=old["status"], after=new["status"],
                            note="worse" if worse else str(new.get("reason") or "")[:80]))
    for metric in _RATE_METRICS:
        a, b = _metric(old, metric), _metric(new, metric)
        if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and a != b:
            found.append(Difference(kind="metric", name=f"{name}.{metric}", before=f"{a:.4g}",
                                after=f"{b:.4g}", note=f"x{b / a:.3f}"))
    return found


def _metric(check: dict[str, Any], metric: str) -> Any:
    """One number of a check; a report whose metrics are null or not a table has none."""
    metrics = check.get("metrics")
    return metrics.get(metric) if isinstance(metrics, dict) else None


def is_regression(change: Difference) -> bool:
    return change.kind == "removed" or (change.kind == "status" and change.note == "worse")
