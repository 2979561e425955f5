"""Run the in-image verification suite and compare its reports.

The suite itself lives in verify/ (``python -m stackpin_verify``) and knows nothing of
stackpin; this module only decides how to run it (the cell's device flags, a bind mount
for the reports, a time limit) and reads what it wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackpin.engine import BindMount, RunRequest, with_run_flags
from stackpin.errors import VerificationError
from stackpin.matrix import Cell

REPORT_SCHEMA = "stackpin.verify/v1"
IN_CONTAINER_REPORTS = "/stackpin-reports"


def report_dir(root: Path, cell_id: str, variant: str) -> Path:
    return root / "build" / "reports" / f"{cell_id}-{variant}"


def verify_request(
    cell: Cell, image: str, *, out_dir: Path, levels: str, dtype: str
) -> RunRequest:
    """The container run of the suite with the platform's device flags and no network."""
    command = ["python", "-m", "stackpin_verify", "--out-dir", IN_CONTAINER_REPORTS]
    if levels:
        command += ["--levels", levels]
    if dtype != "auto":
        command += ["--dtype", dtype]
    request = RunRequest(
        image=image,
        command=tuple(command),
        mounts=(BindMount(source=out_dir, target=IN_CONTAINER_REPORTS),),
        # The suite needs no network: it builds its tiny model and tokenizer in code.
        network_mode="none",
        environment={"PYTHONUNBUFFERED": "1"},
    )
    return with_run_flags(request, cell.run)


def read_report(path: Path) -> dict[str, Any]:
    """A verification report, or a one-line error saying why the file is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        msg = f"{path}: no such report; run 'stackpin verify' to make one"
        raise VerificationError(msg) from None
    except json.JSONDecodeError as exc:
        msg = f"{path}: not JSON ({exc}); point at a report.json written by stackpin_verify"
        raise VerificationError(msg) from None
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        msg = f"{path}: schema is {found!r}, not {REPORT_SCHEMA!r}; not a stackpin report"
        raise VerificationError(msg)
    return data


@dataclass(frozen=True, kw_only=True)
class Change:
    kind: str  # "status", "version", "metric", "added", "removed"
    name: str
    before: str
    after: str
    note: str = ""

    def __str__(self) -> str:
        note = f" ({self.note})" if self.note else ""
        return f"{self.kind:8} {self.name}: {self.before} -> {self.after}{note}"


_WORSE = {("pass", "fail"), ("pass", "skip"), ("skip", "fail")}
_RATE_METRICS = ("tflops", "speedup_vs_sdpa", "tokens_per_s")


def diff_reports(before: dict[str, Any], after: dict[str, Any]) -> list[Change]:
    """What changed between two reports: statuses, versions, throughput ratios."""
    changes: list[Change] = []
    for name in sorted(set(before.get("versions", {})) | set(after.get("versions", {}))):
        old = str(before.get("versions", {}).get(name, "-"))
        new = str(after.get("versions", {}).get(name, "-"))
        if old != new:
            changes.append(Change(kind="version", name=name, before=old, after=new))
    old_checks = {c["name"]: c for c in before.get("checks", [])}
    new_checks = {c["name"]: c for c in after.get("checks", [])}
    for name in sorted(set(old_checks) | set(new_checks)):
        changes += _check_changes(name, old_checks.get(name), new_checks.get(name))
    return changes


def _check_changes(
    name: str, old: dict[str, Any] | None, new: dict[str, Any] | None
) -> list[Change]:
    if old is None or new is None:
        kind = "added" if old is None else "removed"
        status = (new or old or {}).get("status", "?")
        return [Change(kind=kind, name=name, before="-" if old is None else status,
                       after="-" if new is None else status)]
    found = []
    if old["status"] != new["status"]:
        worse = (old["status"], new["status"]) in _WORSE
        found.append(Change(kind="status", name=name, before=old["status"], after=new["status"],
                            note="worse" if worse else new.get("reason", "")[:80]))
    for metric in _RATE_METRICS:
        a, b = old.get("metrics", {}).get(metric), new.get("metrics", {}).get(metric)
        if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and a != b:
            found.append(Change(kind="metric", name=f"{name}.{metric}", before=f"{a:.4g}",
                                after=f"{b:.4g}", note=f"x{b / a:.3f}"))
    return found


def is_regression(change: Change) -> bool:
    return change.kind == "removed" or (change.kind == "status" and change.note == "worse")
