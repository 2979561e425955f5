"""The report: versioned JSON, JUnit XML and the summary table.

Files are written to a temporary name and renamed, so a killed run never leaves half a
report for ``stackpin verify`` to parse.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stackpin_verify import REPORT_SCHEMA
from stackpin_verify.checks import CheckResult

# Metrics shown in the table's "key" column, first present wins.
_KEY_METRICS = (
    "enhanced_over_stable",
    "enhanced_over_stable_fwd_bwd",
    "tflops",
    "speedup_vs_sdpa",
    "max_abs_diff",
    "max_abs_err",
    "relative_rms",
    "loss_after",
    "loss_last",
    "trainable_params",
    "median_ms",
    "count",
    "actual",
    "version",
    "backend",
)


def summarise(checks: Sequence[CheckResult], duration_s: float) -> dict[str, Any]:
    return {
        "passed": sum(c.status == "pass" for c in checks),
        "failed": sum(c.status == "fail" for c in checks),
        "skipped": sum(c.status == "skip" for c in checks),
        "required_failed": sum(c.status == "fail" and c.required for c in checks),
        "duration_s": round(duration_s, 6),
    }


def build_report(
    *,
    checks: Sequence[CheckResult],
    host: dict[str, Any],
    image: dict[str, Any] | None,
    backend: str,
    versions: dict[str, str],
    devices: list[dict[str, Any]],
    duration_s: float,
    created: datetime.datetime | None = None,
    device: dict[str, Any] | None = None,
    recommendation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    created = created or datetime.datetime.now(datetime.timezone.utc)
    extra: dict[str, Any] = {} if device is None else {"device": device}
    if recommendation is not None:
        extra["recommendation"] = recommendation
    return {
        "schema": REPORT_SCHEMA,
        "created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": host,
        "image": image,
        "backend": backend,
        "versions": versions,
        "devices": devices,
        **extra,
        "summary": summarise(checks, duration_s),
        "checks": [c.to_json() for c in checks],
    }


def exit_code(report: dict[str, Any]) -> int:
    """0 when every required check passed or skipped; optional failures do not count."""
    return 1 if report["summary"]["required_failed"] else 0


def to_junit(report: dict[str, Any]) -> ET.Element:
    """One testsuite per level, one testcase per check; reasons in failure/skipped."""
    root = ET.Element("testsuites", name="stackpin-verify")
    by_level: dict[int, list[dict[str, Any]]] = {}
    for check in report["checks"]:
        by_level.setdefault(check["level"], []).append(check)
    for level in sorted(by_level):
        root.append(_suite(level, by_level[level], report["created"]))
    totals = report["summary"]
    root.set("tests", str(len(report["checks"])))
    root.set("failures", str(totals["failed"]))
    root.set("skipped", str(totals["skipped"]))
    root.set("time", f"{totals['duration_s']:.3f}")
    return root


def _suite(level: int, checks: list[dict[str, Any]], created: str) -> ET.Element:
    suite = ET.Element(
        "testsuite",
        name=f"L{level}",
        tests=str(len(checks)),
        failures=str(sum(c["status"] == "fail" for c in checks)),
        errors="0",
        skipped=str(sum(c["status"] == "skip" for c in checks)),
        time=f"{sum(c['duration_s'] for c in checks):.3f}",
        timestamp=created,
    )
    for check in checks:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"stackpin_verify.L{level}",
            name=check["name"],
            time=f"{check['duration_s']:.3f}",
        )
        if check["status"] == "fail":
            kind = "required" if check["required"] else "optional"
            failure = ET.SubElement(case, "failure", message=check["reason"], type=kind)
            failure.text = json.dumps(check["metrics"], sort_keys=True, default=str)
        elif check["status"] == "skip":
            ET.SubElement(case, "skipped", message=check["reason"])
        if check["metrics"]:
            out = ET.SubElement(case, "system-out")
            out.text = json.dumps(check["metrics"], sort_keys=True, default=str)
    return suite


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as the string Python prints for it ("nan",
    "inf", "-inf"): a broken kernel's metric is often NaN, and NaN is not JSON (the grid, jq
    and every strict reader refuse the whole report for it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_reports(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "report.json"
    xml_path = out_dir / "report.xml"
    text = json.dumps(json_safe(report), indent=2, sort_keys=False, default=str,
                      allow_nan=False)
    _atomic_write(json_path, text + "\n")
    root = to_junit(report)
    ET.indent(root)
    xml_text = ET.tostring(root, encoding="unicode", xml_declaration=True)
    _atomic_write(xml_path, xml_text + "\n")
    return json_path, xml_path


def key_metric(metrics: dict[str, Any]) -> str:
    for key in _KEY_METRICS:
        if key in metrics and metrics[key] is not None:
            return f"{key}={_fmt(metrics[key])}"
    return ""


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary_table(report: dict[str, Any], *, reason_width: int = 70) -> str:
    rows = [("check", "status", "key", "reason")]
    for check in report["checks"]:
        status = check["status"].upper() + ("" if check["required"] else " (optional)")
        reason = check["reason"].splitlines()[0] if check["reason"] else ""
        rows.append((check["name"], status, key_metric(check["metrics"]), reason[:reason_width]))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        f"{name:<{widths[0]}}  {status:<{widths[1]}}  {key:<{widths[2]}}  {reason}".rstrip()
        for name, status, key, reason in rows
    ]
    totals = report["summary"]
    lines.append(
        f"passed {totals['passed']}, failed {totals['failed']} "
        f"({totals['required_failed']} required), skipped {totals['skipped']} "
        f"in {totals['duration_s']:.1f} s; backend {report['backend']}"
    )
    lines.extend(recommendation_lines(report.get("recommendation")))
    return "\n".join(lines)


def recommendation_lines(recommendation: dict[str, Any] | None) -> list[str]:
    """Stable versus enhanced under the totals; the note when enhanced is the wrong choice
    here comes last, where a person reading the run's output looks."""
    if not recommendation:
        return []
    lines = [f"recommendation: {recommendation['line']}"]
    if recommendation.get("note"):
        lines.append(str(recommendation["note"]))
    return lines
