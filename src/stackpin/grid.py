"""One compatibility grid from many verification reports, and its regression view.

Rows are cell x variant (or a bare host), columns are the checks grouped by level.
A shipped cell x variant with no report is a *not run* row: absence of evidence is
never shown as a pass. Pure: report texts, cells and a baseline in; Markdown, HTML,
JSON and JUnit text out, byte-stable for the same input (no clock is read).
"""

from __future__ import annotations

import html
import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stackpin.errors import VerificationError
from stackpin.matrix import VARIANTS, Cell

REPORT_SCHEMA = "stackpin.verify/v1"
GRID_SCHEMA = "stackpin.grid/v1"
STATUSES = ("pass", "fail", "skip")
NOT_RUN = "not run"
MISSING = "missing"
LEVEL_NAMES = {
    0: "environment",
    1: "compute",
    2: "JIT",
    3: "attention",
    4: "quantization",
    5: "training",
    6: "correctness",
    7: "distributed",
}
VERSION_KEYS = ("torch", "python", "numpy", "transformers")
# Key numbers and which direction is better; a move the wrong way past the
# threshold is a regression, a move the right way is only marked.
NUMBERS = {
    "gemm_tflops": ("best GEMM TFLOP/s", 1),
    "flash_speedup": ("FlashAttention / SDPA", 1),
    "loss_drop": ("LoRA loss drop", 1),
}
# How good a status is; lower after than before means the check got worse
# (pass->fail, pass->skip, present->missing).
_RANK = {"pass": 3, "skip": 2, "fail": 1, MISSING: 0}


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    level: int
    required: bool
    status: str
    reason: str = ""
    duration_s: float = 0.0
    was: str = ""  # baseline status when it got worse, else ""


@dataclass(frozen=True, kw_only=True)
class Row:
    id: str
    label: str
    cell: str = ""
    variant: str = ""
    host: str = ""
    source: str = ""
    created: str = ""
    backend: str = ""
    ran: bool = True
    versions: Mapping[str, str] = field(default_factory=dict)
    numbers: Mapping[str, float] = field(default_factory=dict)
    gemm_check: str = ""
    loss: tuple[float, float] | None = None
    checks: Mapping[str, Check] = field(default_factory=dict)

    @property
    def result(self) -> str:
        if not self.ran:
            return NOT_RUN
        failed = any(c.status == "fail" and c.required for c in self.checks.values())
        return "fail" if failed else "pass"

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.checks.values())


@dataclass(frozen=True, kw_only=True)
class Change:
    """A check or number that differs from the baseline past the rule; worse ones fail."""

    row: str
    name: str
    kind: str  # "status" or "number"
    old: str
    new: str
    worse: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class Column:
    name: str
    level: int


@dataclass(frozen=True, kw_only=True)
class Grid:
    rows: tuple[Row, ...]
    columns: tuple[Column, ...]
    changes: tuple[Change, ...] = ()
    baseline: str = ""
    threshold: float = 0.0

    @property
    def regressions(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.worse)

    def levels(self) -> list[int]:
        return sorted({c.level for c in self.columns})


# --- reading reports -----------------------------------------------------------------


def _bad(source: str, what: str) -> VerificationError:
    msg = f"{source}: {what}; pass a JSON report written by 'stackpin verify' ({REPORT_SCHEMA})"
    return VerificationError(msg)


def _require(data: Mapping[str, Any], key: str, kind: type, source: str, where: str) -> Any:
    value = data.get(key)
    # bool is an int subclass; a level of `true` is as wrong as a missing one.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _bad(source, f"{where}'{key}' is missing or not a {kind.__name__}")
    return value


def parse_report(source: str, text: str) -> Row:
    """One verification report as a grid row; anything else is a VerificationError."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(source, f"not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else None
        raise _bad(source, f"not a stackpin verification report (schema {found!r})")
    checks, metrics = _parse_checks(_require(data, "checks", list, source, ""), source)
    host = _require(data, "host", dict, source, "")
    versions = _require(data, "versions", dict, source, "")
    row = Row(
        id="",
        label="",
        host=str(host.get("hostname", "")),
        source=source,
        created=str(data.get("created", "")),
        backend=str(data.get("backend", "")),
        versions={k: str(versions[k]) for k in VERSION_KEYS if versions.get(k) is not None},
        checks=checks,
    )
    return _with_numbers(_with_identity(row, data.get("image"), source), metrics)


def _with_identity(row: Row, image: Any, source: str) -> Row:
    if image is None:
        return replace(row, id=f"host:{row.host}", label=f"{row.host} (bare host)")
    if not isinstance(image, dict):
        raise _bad(source, "'image' is neither null nor an object")
    cell = _require(image, "cell", str, source, "image.")
    variant = _require(image, "variant", str, source, "image.")
    return replace(row, id=f"{cell}/{variant}", label=f"{cell} / {variant}", cell=cell,
                   variant=variant)


def _parse_checks(
    items: list[Any], source: str
) -> tuple[dict[str, Check], dict[str, Mapping[str, Any]]]:
    """Checks by name, and their metrics (only needed to derive the key numbers)."""
    checks: dict[str, Check] = {}
    metrics: dict[str, Mapping[str, Any]] = {}
    for i, item in enumerate(items):
        where = f"checks[{i}]."
        if not isinstance(item, dict):
            raise _bad(source, f"checks[{i}] is not an object")
        status = _require(item, "status", str, source, where)
        if status not in STATUSES:
            raise _bad(source, f"{where}status {status!r} is not one of {', '.join(STATUSES)}")
        name = _require(item, "name", str, source, where)
        checks[name] = Check(
            name=name,
            level=_require(item, "level", int, source, where),
            required=bool(item.get("required", True)),
            status=status,
            reason=" ".join(str(item.get("reason") or "").split()),
            duration_s=float(item.get("duration_s") or 0.0),
        )
        found = item.get("metrics")
        metrics[name] = found if isinstance(found, dict) else {}
    return checks, metrics


def _number(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _best_gemm(row: Row, metrics: Mapping[str, Mapping[str, Any]]) -> tuple[float, str] | None:
    # Passing checks only: the speed of a kernel with wrong results is moot.
    measured = [
        (tflops, name)
        for name, check in row.checks.items()
        if name.startswith("L1.gemm.") and check.status == "pass"
        and (tflops := _number(metrics.get(name, {}), "tflops")) is not None
    ]
    return max(measured) if measured else None


def _with_numbers(row: Row, metrics: Mapping[str, Mapping[str, Any]]) -> Row:
    numbers: dict[str, float] = {}
    gemm_check = ""
    best = _best_gemm(row, metrics)
    if best is not None:
        numbers["gemm_tflops"], gemm_check = best
    speedup = _non_skipped(row, metrics, "L3.flash.speedup", "speedup_vs_sdpa")
    if speedup is not None:
        numbers["flash_speedup"] = speedup
    first = _non_skipped(row, metrics, "L5.lora.train", "loss_first")
    last = _non_skipped(row, metrics, "L5.lora.train", "loss_last")
    loss = (first, last) if first is not None and last is not None else None
    if loss and loss[0] > 0:
        numbers["loss_drop"] = (loss[0] - loss[1]) / loss[0]
    return replace(row, numbers=numbers, gemm_check=gemm_check, loss=loss)


def _non_skipped(
    row: Row, metrics: Mapping[str, Mapping[str, Any]], check: str, key: str
) -> float | None:
    # A failed speedup or loss check still measured something worth showing.
    if check not in row.checks or row.checks[check].status == "skip":
        return None
    return _number(metrics.get(check, {}), key)


# --- building the grid ---------------------------------------------------------------


def build_grid(reports: Sequence[Row], cells: Mapping[str, Cell]) -> Grid:
    """Rows for every report plus a *not run* row for each shipped cell x variant without one."""
    rows = list(_disambiguate(reports))
    covered = {(r.cell, r.variant) for r in rows}
    for cell_id in sorted(cells):
        for variant in (v for v in VARIANTS if v in cells[cell_id].variants):
            if (cell_id, variant) not in covered:
                rows.append(
                    Row(id=f"{cell_id}/{variant}", label=f"{cell_id} / {variant}", cell=cell_id,
                        variant=variant, ran=False)
                )
    rows.sort(key=_row_order)
    return Grid(rows=tuple(rows), columns=_columns(rows))


def _columns(rows: Sequence[Row]) -> tuple[Column, ...]:
    """Checks by level, in the order the suite runs them (fp32 before fp16 before bf16)."""
    first_seen: dict[str, tuple[int, int]] = {}
    for row in rows:
        for check in row.checks.values():
            first_seen.setdefault(check.name, (check.level, len(first_seen)))
    ordered = sorted(first_seen.items(), key=lambda item: item[1])
    return tuple(Column(name=name, level=level) for name, (level, _) in ordered)


def _row_order(row: Row) -> tuple[int, str, int, str]:
    variant = VARIANTS.index(row.variant) if row.variant in VARIANTS else len(VARIANTS)
    return (0 if row.cell else 1, row.cell, variant, row.id)


def _disambiguate(reports: Sequence[Row]) -> Iterable[Row]:
    """Reports for the same cell x variant from several hosts stay separate rows."""
    seen: dict[str, int] = {}
    for row in reports:
        seen[row.id] = seen.get(row.id, 0) + 1
    for row in sorted(reports, key=lambda r: (r.id, r.host, r.source)):
        if seen[row.id] > 1:
            row = replace(row, id=f"{row.id}@{row.host}", label=f"{row.label} @ {row.host}")
        yield row


# --- baseline comparison -------------------------------------------------------------


def parse_baseline(source: str, text: str) -> dict[str, dict[str, Any]]:
    """A previous grid.json as {row id: {"checks": {name: status}, "numbers": {...}}}."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"{source}: not JSON ({exc.msg}); --baseline takes a 'report grid' output dir"
        raise VerificationError(msg) from None
    if not isinstance(data, dict) or data.get("schema") != GRID_SCHEMA:
        msg = f"{source}: not a stackpin grid (schema {GRID_SCHEMA}); rebuild it with 'report grid'"
        raise VerificationError(msg)
    rows: dict[str, dict[str, Any]] = {}
    for row in data.get("rows", []):
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
        columns=_columns(rows),
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
        if before == MISSING or _RANK.get(after, 0) >= _RANK.get(before, 0):
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
            changes.append(Change(row=row.id, name=key, kind="number", old=_fmt(before),
                                  new=MISSING, worse=True, detail="no longer measured"))
            continue
        moved = _relative(before, after)
        if moved <= threshold:
            continue
        worse = (after - before) * better < 0
        moved_by = f"{_pct(after, before)}; threshold {threshold:.0%}"
        detail = f"{_fmt(before)} -> {_fmt(after)} ({moved_by})"
        changes.append(Change(row=row.id, name=key, kind="number", old=_fmt(before),
                              new=_fmt(after), worse=worse, detail=detail))
    return changes


def _relative(before: float, after: float) -> float:
    if before == 0:
        return 0.0 if after == 0 else math.inf
    return abs(after - before) / abs(before)


def _pct(after: float, before: float) -> str:
    return "new" if before == 0 else f"{(after - before) / abs(before):+.1%}"


def _fmt(value: float) -> str:
    return f"{value:.4g}"


# --- shared presentation helpers -----------------------------------------------------


def _level_title(level: int) -> str:
    return f"L{level} {LEVEL_NAMES.get(level, '')}".strip()


def _number_text(row: Row, key: str) -> str:
    value = row.numbers.get(key)
    if key == "loss_drop":
        if row.loss is None:
            return ""
        return f"{_fmt(row.loss[0])} → {_fmt(row.loss[1])}" + (
            f" ({-value:+.0%})" if value is not None else ""
        )
    if value is None:
        return ""
    if key == "gemm_tflops":
        return f"{_fmt(value)} ({row.gemm_check.removeprefix('L1.gemm.')})"
    return f"{_fmt(value)}x"


def _number_change(grid: Grid, row: Row, key: str) -> Change | None:
    for change in grid.changes:
        if change.row == row.id and change.kind == "number" and change.name == key:
            return change
    return None


def summary_line(grid: Grid) -> str:
    ran = sum(r.ran for r in grid.rows)
    failing = sum(r.result == "fail" for r in grid.rows)
    line = (
        f"{len(grid.rows)} rows: {ran} ran ({failing} failing a required check), "
        f"{len(grid.rows) - ran} not run"
    )
    if grid.baseline:
        line += f"; {len(grid.regressions)} regression(s) against {grid.baseline}"
    return line


# --- JSON ----------------------------------------------------------------------------


def render_json(grid: Grid) -> str:
    rows = [
        {
            "id": r.id,
            "label": r.label,
            "cell": r.cell,
            "variant": r.variant,
            "host": r.host,
            "source": r.source,
            "created": r.created,
            "backend": r.backend,
            "result": r.result,
            "counts": {s: r.count(s) for s in STATUSES},
            "versions": dict(r.versions),
            "numbers": dict(r.numbers),
            "checks": {
                n: {"status": c.status, "reason": c.reason, "required": c.required,
                    **({"was": c.was} if c.was else {})}
                for n, c in r.checks.items()
            },
        }
        for r in grid.rows
    ]
    data = {
        "schema": GRID_SCHEMA,
        "columns": [{"name": c.name, "level": c.level} for c in grid.columns],
        "rows": rows,
        "baseline": (
            {"source": grid.baseline, "threshold": grid.threshold} if grid.baseline else None
        ),
        "changes": [vars(c) for c in grid.changes],
        "regressions": len(grid.regressions),
    }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


# --- Markdown ------------------------------------------------------------------------


class _Footnotes:
    """Numbered reasons, one number per distinct text so a repeated skip reads once."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}

    def ref(self, text: str) -> str:
        if not text:
            return ""
        number = self.numbers.setdefault(text, len(self.numbers) + 1)
        return f"[^{number}]"

    def lines(self) -> list[str]:
        return [f"[^{n}]: {_md_escape(t)}" for t, n in self.numbers.items()]


def _md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


_MD_STATUS = {"pass": "pass", "fail": "**FAIL**", "skip": "skip", MISSING: "**missing**"}


def _md_cell(check: Check | None, row: Row, notes: _Footnotes) -> str:
    if not row.ran:
        return "*not run*"
    if check is None:
        return "—"
    text = _MD_STATUS[check.status]
    if check.status == "fail" and not check.required:
        text = "fail (optional)"
    if check.was:
        text += f" ▼ was {check.was}"
    return text + notes.ref(check.reason)


def render_markdown(grid: Grid) -> str:
    notes = _Footnotes()
    lines = [
        "# stackpin compatibility grid",
        "",
        summary_line(grid) + ".",
        "",
        "Legend: pass · **FAIL** (a required check) · fail (optional) · skip · *not run* "
        "(no report for this cell x variant) · — (check not in that report) · ▼ worse than "
        "the baseline. Footnotes give each reason.",
        "",
        "## Summary",
        "",
        *_md_summary(grid),
    ]
    for level in grid.levels():
        cols = [c for c in grid.columns if c.level == level]
        lines += ["", f"## {_level_title(level)}", ""]
        lines.append("| row | " + " | ".join(_md_escape(c.name) for c in cols) + " |")
        lines.append("|---" * (len(cols) + 1) + "|")
        for row in grid.rows:
            cells = [_md_cell(row.checks.get(c.name), row, notes) for c in cols]
            lines.append(f"| {_md_escape(row.label)} | " + " | ".join(cells) + " |")
    lines += _md_changes(grid)
    if notes.numbers:
        lines += ["", *notes.lines()]
    return "\n".join(lines) + "\n"


def _md_summary(grid: Grid) -> list[str]:
    head = ["row", "result", "pass", "fail", "skip", *VERSION_KEYS,
            *(label for label, _ in NUMBERS.values())]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for row in grid.rows:
        result = {"fail": "**FAIL**", NOT_RUN: "*not run*"}.get(row.result, row.result)
        counts = [str(row.count(s)) if row.ran else "" for s in STATUSES]
        versions = [_md_escape(row.versions.get(k, "")) for k in VERSION_KEYS]
        numbers = []
        for key in NUMBERS:
            text = _number_text(row, key)
            change = _number_change(grid, row, key)
            if change is not None:
                text += (" ▼ " if change.worse else " △ ") + f"was {change.old}"
            numbers.append(_md_escape(text))
        cells = [_md_escape(row.label), result, *counts, *versions, *numbers]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _md_changes(grid: Grid) -> list[str]:
    if not grid.baseline:
        return []
    lines = ["", f"## Changes against the baseline ({_md_escape(grid.baseline)})", ""]
    if not grid.changes:
        limit = f"{grid.threshold:.0%}"
        return [*lines, f"Nothing got worse; no key number moved by more than {limit}."]
    for c in grid.changes:
        mark = "REGRESSION" if c.worse else "improved"
        name = NUMBERS[c.name][0] if c.kind == "number" else c.name
        lines.append(f"- {mark}: {_md_escape(c.row)}: {_md_escape(name)} {_md_escape(c.detail)}")
    return lines


# --- HTML ----------------------------------------------------------------------------

_CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:16px;color:#1b1f24}
h1{font-size:20px;margin:0 0 4px}
h2{font-size:15px;margin:18px 0 6px}
p.summary{margin:0 0 8px;color:#444}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #c8ccd0;padding:2px 5px;text-align:center;white-space:nowrap}
th.row{text-align:left;background:#f6f8fa;position:sticky;left:0}
th.level{background:#e8ecf0}
th.check{vertical-align:bottom;background:#f6f8fa;padding:4px 1px;font-weight:normal}
th.check span{writing-mode:vertical-rl;transform:rotate(180deg);display:inline-block}
table.grid td{min-width:14px;padding:2px 3px}
.pass{background:#d4f4dd;color:#145a24}
.fail{background:#f9d0d0;color:#8a1010;font-weight:bold}
.fail.optional{background:#fde8c8;color:#7a4a00;font-weight:normal}
.skip{background:#eceff1;color:#555}
.missing{background:#fff;color:#999}
.notrun{background:repeating-linear-gradient(45deg,#f3f3f3,#f3f3f3 4px,#e2e2e2 4px,
 #e2e2e2 8px);color:#555;font-style:italic}
td.worse,span.worse{outline:3px solid #c00;outline-offset:-3px}
td.better{outline:2px dashed #2a7;outline-offset:-2px}
td.num{text-align:right}
ul.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:12px;margin:6px 0}
ul.legend li span{display:inline-block;padding:0 6px;border:1px solid #c8ccd0}
section.changes li.worse{color:#8a1010}
"""

# One glyph per grid cell keeps dozens of check columns on one screen; the
# status word and reason are in the cell's title (hover) and the legend.
_GLYPH = {"pass": "✓", "fail": "✗", "skip": "○", MISSING: "!"}


def _td(text: str, css: str, title: str = "", extra: str = "") -> str:
    title_attr = f' title="{html.escape(title)}"' if title else ""
    return f'<td class="{css}"{title_attr}{extra}>{html.escape(text)}</td>'


def _html_check(check: Check | None) -> str:
    if check is None:
        return _td("", "missing", "check not in this report")
    css = check.status + (" optional" if check.status == "fail" and not check.required else "")
    title = f"{check.name}: {check.status}" + (f": {check.reason}" if check.reason else "")
    text = _GLYPH[check.status]
    if check.was:
        css, text, title = css + " worse", text + "▼", f"{title} (was {check.was})"
    return _td(text, css, title)


def _html_number(grid: Grid, row: Row, key: str) -> str:
    text = _number_text(row, key)
    change = _number_change(grid, row, key)
    if change is None:
        return _td(text, "num")
    css = "num worse" if change.worse else "num better"
    return _td(text + (" ▼" if change.worse else " △"), css, f"was {change.old}: {change.detail}")


def _row_header(row: Row) -> str:
    where = f"{row.host} · {row.source}" if row.ran else "no report"
    return f'<th scope="row" class="row" title="{html.escape(where)}">{html.escape(row.label)}</th>'


def _html_summary(grid: Grid) -> list[str]:
    head = ["row", "result", "pass", "fail", "skip", *VERSION_KEYS,
            *(label for label, _ in NUMBERS.values()), "host"]
    lines = ['<table class="summary" id="summary"><thead><tr>']
    lines.append("".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>")
    for row in grid.rows:
        css = {"pass": "pass", "fail": "fail", NOT_RUN: "notrun"}[row.result]
        cells = [
            _row_header(row),
            _td(row.result, css),
            *(_td(str(row.count(s)) if row.ran else "", "num") for s in STATUSES),
            *(_td(row.versions.get(k, ""), "") for k in VERSION_KEYS),
            *(_html_number(grid, row, k) for k in NUMBERS),
            _td(row.host, ""),
        ]
        lines.append(f'<tr id="summary-{html.escape(row.id)}">' + "".join(cells) + "</tr>")
    return [*lines, "</tbody></table>"]


def _html_grid(grid: Grid) -> list[str]:
    head1 = '<th rowspan="2" class="row">row</th>'
    for level in grid.levels():
        span = sum(c.level == level for c in grid.columns)
        head1 += f'<th colspan="{span}" class="level">{html.escape(_level_title(level))}</th>'
    head2 = "".join(
        f'<th class="check" scope="col"><span>{html.escape(c.name)}</span></th>'
        for c in grid.columns
    )
    lines = ['<table class="grid" id="grid">', f"<thead><tr>{head1}</tr><tr>{head2}</tr></thead>"]
    lines.append("<tbody>")
    for row in grid.rows:
        if row.ran:
            cells = "".join(_html_check(row.checks.get(c.name)) for c in grid.columns)
        else:
            # One spanning cell: a row with no report has no per-check status to show.
            colspan = f' colspan="{max(len(grid.columns), 1)}"'
            cells = _td("not run: no report for this cell x variant", "notrun", "", colspan)
        lines.append(f'<tr id="{html.escape(row.id)}">{_row_header(row)}{cells}</tr>')
    return [*lines, "</tbody></table>"]


_HTML_LEGEND = (
    '<ul class="legend">'
    + "".join(
        f'<li><span class="{css}">{text}</span> {what}</li>'
        for css, text, what in (
            ("pass", _GLYPH["pass"], "pass"),
            ("fail", _GLYPH["fail"], "required check failed"),
            ("fail optional", _GLYPH["fail"], "optional check failed"),
            ("skip", _GLYPH["skip"], "skipped"),
            ("missing", "", "not in that report"),
            ("missing", _GLYPH[MISSING], "vanished since the baseline"),
            ("notrun", "not run", "no report"),
            ("worse", "▼", "worse than the baseline"),
        )
    )
    + "</ul>"
)


def render_html(grid: Grid) -> str:
    """A self-contained page: inline CSS, no scripts, no fetched assets."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>stackpin compatibility grid</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>stackpin compatibility grid</h1>",
        f'<p class="summary">{html.escape(summary_line(grid))}. '
        "Hover a cell for the check, its status and reason.</p>",
        _HTML_LEGEND,
        "<h2>Checks by level</h2>",
        *_html_grid(grid),
        "<h2>Versions and key numbers</h2>",
        *_html_summary(grid),
        *_html_changes(grid),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _html_changes(grid: Grid) -> list[str]:
    if not grid.baseline:
        return []
    items = []
    for c in grid.changes:
        name = NUMBERS[c.name][0] if c.kind == "number" else c.name
        mark = "regression" if c.worse else "improved"
        items.append(
            f'<li class="{"worse" if c.worse else "better"}">{mark}: {html.escape(c.row)}: '
            f"{html.escape(name)} {html.escape(c.detail)}</li>"
        )
    if not items:
        moved = f"no key number moved by more than {grid.threshold:.0%}"
        items.append(f"<li>nothing got worse; {moved}</li>")
    title = html.escape(f"Changes against the baseline ({grid.baseline})")
    return [f'<section class="changes"><h2>{title}</h2><ul>', *items, "</ul></section>"]


# --- JUnit ---------------------------------------------------------------------------


def render_junit(grid: Grid) -> str:
    """JUnit XML: one testsuite per row, one testcase per check (and per regressed number)."""
    root = ET.Element("testsuites", name="stackpin grid")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for row in grid.rows:
        suite = _junit_suite(grid, row)
        root.append(suite)
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _junit_suite(grid: Grid, row: Row) -> ET.Element:
    suite = ET.Element("testsuite", name=row.label)
    if row.host:
        suite.set("hostname", row.host)
    props = ET.SubElement(suite, "properties")
    for key, value in [("source", row.source), *sorted(row.versions.items())]:
        if value:
            ET.SubElement(props, "property", name=key, value=value)
    classname = row.id.replace("/", ".")
    if not row.ran:
        case = ET.SubElement(suite, "testcase", classname=classname, name=NOT_RUN)
        ET.SubElement(case, "skipped", message="no report for this cell x variant")
    for check in sorted(row.checks.values(), key=lambda c: (c.level, c.name)):
        _junit_case(suite, classname, check)
    for change in grid.changes:
        if change.row == row.id and change.kind == "number" and change.worse:
            name = f"numbers.{change.name}"
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            message = f"regression: {change.detail}"
            ET.SubElement(case, "failure", message=message, type="regression")
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    suite.set("errors", "0")
    return suite


def _junit_case(suite: ET.Element, classname: str, check: Check) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname, name=check.name,
                         time=f"{check.duration_s:.3f}")
    prefix = f"regression (baseline {check.was}): " if check.was else ""
    if check.status in ("fail", MISSING) or check.was:
        kind = "regression" if check.was else "fail"
        ET.SubElement(case, "failure", message=prefix + (check.reason or check.status), type=kind)
    elif check.status == "skip":
        ET.SubElement(case, "skipped", message=check.reason or "skipped")


# --- front door ----------------------------------------------------------------------

OUTPUTS = {
    "grid.md": render_markdown,
    "grid.html": render_html,
    "grid.json": render_json,
    "grid.xml": render_junit,
}


def render_all(grid: Grid) -> dict[str, str]:
    """Every output file name with its text."""
    return {name: render(grid) for name, render in OUTPUTS.items()}

