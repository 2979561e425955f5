"""The grid's renderers: Markdown, HTML, JSON and JUnit text from a ``reports.Grid``.

Byte-stable for the same grid (no clock is read); the model, the report parsing and the
baseline comparison are in ``stackpin.reports``.
"""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET

from stackpin.reports import (
    GRID_SCHEMA,
    LEVEL_NAMES,
    MISSING,
    NOT_RUN,
    NUMBERS,
    STATUSES,
    VERSION_KEYS,
    Change,
    Check,
    Grid,
    Row,
    fmt_number,
)

# --- shared presentation helpers -----------------------------------------------------


def _level_title(level: int) -> str:
    return f"L{level} {LEVEL_NAMES.get(level, '')}".strip()


def _number_text(row: Row, key: str) -> str:
    value = row.numbers.get(key)
    if key == "loss_drop":
        if row.loss is None:
            return ""
        return f"{fmt_number(row.loss[0])} → {fmt_number(row.loss[1])}" + (
            f" ({-value:+.0%})" if value is not None else ""
        )
    if value is None:
        return ""
    if key == "gemm_tflops":
        return f"{fmt_number(value)} ({row.gemm_check.removeprefix('L1.gemm.')})"
    return f"{fmt_number(value)}x"


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
            "recommendation": _advice_json(r),
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


def _advice_json(row: Row) -> dict[str, str] | None:
    advice = row.advice
    if advice is None:
        return None
    return {"choice": advice.choice, "line": advice.line, "note": advice.note}


def _advice_short(row: Row) -> str:
    return row.advice.short if row.advice is not None else ""


def _advised(grid: Grid) -> list[Row]:
    return [r for r in grid.rows if r.advice is not None]


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
    lines += _md_advice(grid)
    lines += _md_changes(grid)
    if notes.numbers:
        lines += ["", *notes.lines()]
    return "\n".join(lines) + "\n"


def _md_summary(grid: Grid) -> list[str]:
    head = ["row", "result", "pass", "fail", "skip", *VERSION_KEYS,
            *(label for label, _ in NUMBERS.values()), "recommendation"]
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
        cells = [_md_escape(row.label), result, *counts, *versions, *numbers,
                 _md_escape(_advice_short(row))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _md_advice(grid: Grid) -> list[str]:
    """Each row's recommendation in full; a note (enhanced is the wrong choice) in bold."""
    rows = _advised(grid)
    if not rows:
        return []
    lines = ["", "## Stable versus enhanced", ""]
    for row in rows:
        assert row.advice is not None
        lines.append(f"- {_md_escape(row.label)}: {_md_escape(row.advice.line)}")
        if row.advice.note:
            lines.append(f"  **{_md_escape(row.advice.note)}**")
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
td.note,strong.note{background:#fde8c8;color:#7a4a00}
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
            *(label for label, _ in NUMBERS.values()), "recommendation", "host"]
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
            _td(_advice_short(row), "note" if row.advice and row.advice.note else "",
                row.advice.line if row.advice else ""),
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
        *_html_advice(grid),
        *_html_changes(grid),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _html_advice(grid: Grid) -> list[str]:
    rows = _advised(grid)
    if not rows:
        return []
    items = []
    for row in rows:
        assert row.advice is not None
        note = (f'<br><strong class="note">{html.escape(row.advice.note)}</strong>'
                if row.advice.note else "")
        items.append(f"<li>{html.escape(row.label)}: {html.escape(row.advice.line)}{note}</li>")
    return ['<section class="advice"><h2>Stable versus enhanced</h2><ul>', *items,
            "</ul></section>"]


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
    advice = [("recommendation", row.advice.line)] if row.advice else []
    for key, value in [("source", row.source), *sorted(row.versions.items()), *advice]:
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

