"""Verification reports: reading them and merging many into one grid.

A report is the JSON the in-image suite writes (``stackpin.verify/v1``). This module is
the one place that reads one (``load_report``) and turns many into a grid model: rows are
cell x variant (or a bare host), columns the checks grouped by level (what got worse
between two reports or two grids: ``stackpin.comparison``). A shipped cell x variant
with no report is a *not run* row: absence of evidence is never shown as a pass. Pure:
texts and cells in, plain objects out; the grid's renderers (Markdown, HTML, JSON,
JUnit) live in ``stackpin.grid``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stackpin import recommendation
from stackpin.errors import VerificationError
from stackpin.matrix import VARIANTS, Cell, Variant
from stackpin.rehearsalspec import RUN_KIND as REHEARSAL_RUN_KIND
from stackpin.shapes import (
    any_of,
    anything,
    array,
    boolean,
    conform,
    integer,
    mapping,
    numeric,
    obj,
    one_of,
    optional,
    scalar,
    text,
)
from stackpin.untrusted import parse_json, read_bounded, shown

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
    8: "service",
}
VERSION_KEYS = ("torch", "python", "numpy", "transformers")
# Key numbers and which direction is better; a move the wrong way past the
# threshold is a regression, a move the right way is only marked.
NUMBERS = {
    "gemm_tflops": ("best GEMM TFLOP/s", 1),
    "flash_vs_sdpa_default": ("FlashAttention speed-up vs SDPA default kernel", 1),
    "flash_vs_sdpa_math": ("FlashAttention speed-up vs SDPA math path", 1),
    "loss_drop": ("LoRA loss drop", 1),
    # The recommendation's deciding ratio: lower is a faster enhanced variant.
    recommendation.NUMBER: ("enhanced time / stable time", -1),
}
# How good a status is; lower after than before means the check got worse
# (pass->fail, pass->skip, present->missing).
_RANK = {"pass": 3, "skip": 2, "fail": 1, MISSING: 0}


def got_worse(before: str, after: str) -> bool:
    return _RANK.get(after, 0) < _RANK.get(before, 0)


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
    advice: recommendation.Advice | None = None
    kind: str = "image"  # one of RUN_KINDS: what ran, never a stand-in called an image

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


MAX_REPORT_BYTES = 64 << 20


def _bad(source: str, what: str) -> VerificationError:
    msg = (f"{shown(source)}: {what}; pass a JSON report written by 'stackpin verify' "
           f"({REPORT_SCHEMA})")
    return VerificationError(msg)


def _require(data: Mapping[str, Any], key: str, kind: type, source: str, where: str) -> Any:
    value = data.get(key)
    # bool is an int subclass; a level of `true` is as wrong as a missing one.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _bad(source, f"{where}'{key}' is missing or not a {kind.__name__}")
    return value


_CHECK = obj({
    "name": text(limit=256),
    "level": integer(0, 1000),
    "status": one_of(*STATUSES),
    "required": optional(boolean),
    "reason": optional(text(limit=1 << 16)),
    "duration_s": optional(numeric(0, 1e9)),
    "metrics": optional(mapping(anything, limit=4096)),  # read only through _number
}, optional_keys=("level", "required", "reason", "duration_s", "metrics"))
_REPORT = obj({
    "schema": text(limit=64),
    "created": optional(text(limit=64)),
    "backend": optional(text(limit=256)),
    "host": mapping(any_of(scalar, array(scalar, limit=256), mapping(scalar))),
    "image": optional(obj({"cell": text(limit=256), "variant": text(limit=64)})),
    "versions": mapping(scalar),
    "summary": obj({"required_failed": integer(0, 1 << 31)}),
    "checks": array(_CHECK, limit=100_000),
    "recommendation": optional(recommendation.SHAPE),
}, optional_keys=("created", "backend", "host", "image", "versions", "summary", "recommendation"))

def load_report(source: str, data: str | bytes) -> dict[str, Any]:
    """A report's JSON object, schema-checked; else a one-line VerificationError."""
    try:
        document = parse_json(data.encode() if isinstance(data, str) else data,
                              what="the file", error=VerificationError)
    except VerificationError as exc:
        raise _bad(source, exc.message) from None
    if not isinstance(document, dict) or document.get("schema") != REPORT_SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else None
        raise _bad(source, f"not a stackpin verification report (schema {shown(found)!r})")
    conform(_REPORT, document, lambda problem: _bad(source, problem))
    return document


def read_document(path: Path) -> bytes:
    """A report (or grid) file's bytes, size-capped; unreadable is one VerificationError."""
    return read_bounded(path, limit=MAX_REPORT_BYTES, what="report file",
                        error=VerificationError)


def read_report(path: Path) -> dict[str, Any]:
    """The report at ``path`` (``load_report`` of its text)."""
    return load_report(str(path), read_document(path))


def report_dir(root: Path, cell_id: str, variant: Variant) -> Path:
    return root / "build" / "reports" / f"{cell_id}-{variant}"


def parse_report(source: str, data_text: str | bytes) -> Row:
    """One verification report as a grid row; anything else is a VerificationError."""
    data = load_report(source, data_text)
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
        advice=recommendation.parse(data),
    )
    return _with_numbers(_with_identity(row, data.get("image"), source), metrics)


# What a report ran on: the built image; the cell's lock installed on a device host without
# the image (scripts/gpu/replay-lock.sh); a host's own packages with image info written by
# hand (their lock digest says "none: ..."); or an image built from vendor stand-ins
# (stackpin.rehearsal: its image.json says so). Rows of different kinds never merge.
_KIND_SUFFIX = {"image": "", "lock replayed on device": "~replay", "host stack": "~host",
                REHEARSAL_RUN_KIND: "~rehearsal"}
RUN_KINDS = tuple(_KIND_SUFFIX)


def run_kind(image: Mapping[str, Any], source: str) -> str:
    kind = image.get("run_kind")
    if image.get("rehearsal") is not None and kind not in (None, REHEARSAL_RUN_KIND):
        # An image built from stand-ins says so twice; a report that drops one is refused.
        raise _bad(source, f"image.rehearsal is set but image.run_kind is {str(kind)[:40]!r}")
    if kind is None:
        if image.get("rehearsal") is not None:
            return REHEARSAL_RUN_KIND
        return "host stack" if str(image.get("lock_digest", "")).startswith("none") else "image"
    if kind not in RUN_KINDS:
        raise _bad(source, f"image.run_kind {str(kind)[:40]!r} is not one of {list(RUN_KINDS)}")
    return str(kind)


def _with_identity(row: Row, image: Any, source: str) -> Row:
    if image is None:
        return replace(row, id=f"host:{row.host}", label=f"{row.host} (bare host)",
                       kind="host stack")
    if not isinstance(image, dict):
        raise _bad(source, "'image' is neither null nor an object")
    cell = _require(image, "cell", str, source, "image.")
    variant = _require(image, "variant", str, source, "image.")
    kind = run_kind(image, source)
    label = f"{cell} / {variant}" + (f" ({kind})" if kind != "image" else "")
    return replace(row, id=f"{cell}/{variant}{_KIND_SUFFIX[kind]}", label=label, cell=cell,
                   variant=variant, kind=kind)


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
    for number, keys in _SPEEDUPS.items():
        speedup = next(
            (v for k in keys if (v := _non_skipped(row, metrics, "L3.flash.speedup", k))), None
        )
        if speedup is not None:
            numbers[number] = speedup
    first = _non_skipped(row, metrics, "L5.lora.train", "loss_first")
    last = _non_skipped(row, metrics, "L5.lora.train", "loss_last")
    loss = (first, last) if first is not None and last is not None else None
    if loss and loss[0] > 0:
        numbers["loss_drop"] = (loss[0] - loss[1]) / loss[0]
    if row.advice is not None and row.advice.ratio is not None:
        numbers[recommendation.NUMBER] = row.advice.ratio
    return replace(row, numbers=numbers, gemm_check=gemm_check, loss=loss)


# Reports before issue 13 named the math-path ratio "speedup_vs_sdpa".
_SPEEDUPS = {
    "flash_vs_sdpa_default": ("speedup_vs_sdpa_default",),
    "flash_vs_sdpa_math": ("speedup_vs_sdpa_math", "speedup_vs_sdpa"),
}


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
    return Grid(rows=tuple(rows), columns=columns(rows))


def columns(rows: Sequence[Row]) -> tuple[Column, ...]:
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


def fmt_number(value: float) -> str:
    return f"{value:.4g}"
