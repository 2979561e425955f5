"""Report JSON against its schema, JUnit XML structure, summary and exit codes."""

from __future__ import annotations

import copy
import datetime
import json
import xml.etree.ElementTree as ET

import pytest
import verify_helpers

from stackpin_verify import REPORT_SCHEMA, report, schema
from stackpin_verify.checks import CheckFailed, CheckResult, Skip, run_check

CREATED = datetime.datetime(2026, 11, 30, 4, 0, 0, tzinfo=datetime.timezone.utc)


def _fail() -> dict[str, object]:
    msg = "numpy 2.1.3 violates the image constraint numpy<2"
    raise CheckFailed(msg, {"version": "2.1.3"})


def _skip() -> dict[str, object]:
    msg = "triton is not installed"
    raise Skip(msg)


def _crash() -> dict[str, object]:
    return {"ratio": 1 / 0}


@pytest.fixture
def checks() -> list[CheckResult]:
    return [
        run_check("L0.numpy", _fail),
        run_check("L1.gemm.fp32", lambda: {"tflops": 1.5, "shape": [8, 8, 8]}),
        run_check("L2.triton.vector_add", _skip),
        run_check("L3.flash.speedup", _crash, required=False),
    ]


@pytest.fixture
def sample(checks: list[CheckResult]) -> dict[str, object]:
    return report.build_report(
        checks=checks,
        host={
            "hostname": "h",
            "machine": "x86_64",
            "python": "3.11.7",
            "cpu_count": 2,
            "cgroup_cpus": 1.5,
            "cgroup_memory_bytes": None,
        },
        image=verify_helpers.image_info(),
        backend="cpu",
        versions={"python": "3.11.7", "torch": "2.13.0+cpu"},
        devices=[],
        duration_s=1.25,
        created=CREATED,
    )


def test_run_check_maps_outcomes_to_statuses(checks: list[CheckResult]):
    numpy, gemm, triton, speedup = checks
    assert (numpy.status, numpy.level, numpy.metrics) == ("fail", 0, {"version": "2.1.3"})
    assert (gemm.status, gemm.reason, gemm.metrics["tflops"]) == ("pass", "", 1.5)
    assert (triton.status, triton.reason) == ("skip", "triton is not installed")
    assert speedup.status == "fail"
    assert speedup.reason.startswith("ZeroDivisionError: division by zero (at ")


def test_report_matches_its_schema(sample: dict[str, object]):
    assert schema.validate(sample, schema.load_schema()) == []
    assert sample["schema"] == REPORT_SCHEMA
    assert sample["created"] == "2026-11-30T04:00:00Z"
    assert sample["summary"] == {
        "passed": 1,
        "failed": 2,
        "skipped": 1,
        "required_failed": 1,
        "duration_s": 1.25,
    }


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("host"), "$: missing 'host'"),
        (lambda r: r["checks"][0].update(status="broken"), "$.checks[0].status: 'broken' is not"),
        (lambda r: r["checks"][1].update(name="gemm"), "$.checks[1].name: 'gemm' does not match"),
        (
            lambda r: r["summary"].update(passed=True),
            "$.summary.passed: expected integer, got bool",
        ),
        (lambda r: r.update(backend="hip"), "$.backend: 'hip' is not one of"),
        (lambda r: r["host"].update(cgroup_cpus="2"), "$.host.cgroup_cpus: expected number/null"),
        (lambda r: r.update(extra=1), "$: unexpected key 'extra'"),
    ],
)
def test_schema_validator_rejects_broken_reports(sample, mutate, message):
    broken = copy.deepcopy(sample)
    mutate(broken)
    errors = schema.validate(broken, schema.load_schema())
    assert any(error.startswith(message) for error in errors), errors


def test_exit_code_counts_required_failures_only(sample: dict[str, object]):
    assert report.exit_code(sample) == 1
    optional_only = copy.deepcopy(sample)
    optional_only["summary"]["required_failed"] = 0
    assert report.exit_code(optional_only) == 0


def test_junit_has_one_suite_per_level_and_reasons(sample: dict[str, object]):
    root = report.to_junit(sample)
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert list(suites) == ["L0", "L1", "L2", "L3"]
    assert root.get("tests") == "4"
    assert root.get("failures") == "2"
    failure = suites["L0"].find("testcase/failure")
    assert failure is not None
    assert failure.get("message") == "numpy 2.1.3 violates the image constraint numpy<2"
    assert failure.get("type") == "required"
    assert suites["L3"].find("testcase/failure").get("type") == "optional"
    skipped = suites["L2"].find("testcase/skipped")
    assert skipped.get("message") == "triton is not installed"
    passed = suites["L1"].find("testcase")
    assert passed.get("name") == "L1.gemm.fp32"
    assert passed.find("failure") is None
    assert json.loads(passed.find("system-out").text)["tflops"] == 1.5


def test_write_reports_round_trips(sample: dict[str, object], tmp_path):
    json_path, xml_path = report.write_reports(sample, tmp_path / "out")
    assert json.loads(json_path.read_text()) == sample
    parsed = ET.parse(xml_path).getroot()
    assert parsed.tag == "testsuites"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.json", "report.xml"]


def test_summary_table_lists_each_check_with_key_number(sample: dict[str, object]):
    table = report.summary_table(sample).splitlines()
    assert table[0].split() == ["check", "status", "key", "reason"]
    gemm = next(line for line in table if line.startswith("L1.gemm.fp32"))
    assert gemm.split()[1:3] == ["PASS", "tflops=1.5"]
    speedup = next(line for line in table if line.startswith("L3.flash.speedup"))
    assert "FAIL (optional)" in speedup
    assert table[-1].startswith("passed 1, failed 2 (1 required), skipped 1 in 1.2 s")


def test_a_nan_metric_is_written_as_strict_json(sample: dict[str, object], tmp_path):
    """A broken kernel's error is often NaN or inf: the report must stay JSON that strict
    readers (the grid, jq) take, with the value still saying what it was."""
    broken = copy.deepcopy(sample)
    checks = broken["checks"]
    assert isinstance(checks, list)
    checks[0]["metrics"] = {"max_abs_diff": float("nan"), "bound": float("inf"),
                            "per_row": [1.0, float("-inf")]}
    json_path, _ = report.write_reports(broken, tmp_path / "out")
    text = json_path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    metrics = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the report"))[
        "checks"][0]["metrics"]
    assert metrics == {"max_abs_diff": "nan", "bound": "inf", "per_row": [1.0, "-inf"]}
