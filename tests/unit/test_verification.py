"""How stackpin runs the suite (request objects) and compares its reports."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.conftest import CPU_CELL, K100_CELL

from stackpin.cli.main import cli
from stackpin.comparison import diff_reports, is_regression
from stackpin.errors import VerificationError
from stackpin.reports import read_report
from stackpin.verification import verify_request

FIXTURES = Path(__file__).parent / "fixtures" / "reports"


def _report() -> dict:
    return {
        "schema": "stackpin.verify/v1",
        "versions": {"torch": "2.13.0+cpu", "numpy": "1.26.4"},
        "summary": {"passed": 2, "failed": 0, "skipped": 0, "required_failed": 0},
        "checks": [
            {"name": "L1.gemm.fp32", "status": "pass", "reason": "", "metrics": {"tflops": 0.2}},
            {"name": "L5.lora.train", "status": "pass", "reason": "", "metrics": {"loss_last": 0.1}},
        ],
    }


def test_dtk_request_carries_device_flags_and_no_network(shipped_cells, tmp_path: Path):
    request = verify_request(shipped_cells[K100_CELL], "img:tag", out_dir=tmp_path, levels="0,1",
                             dtype="bf16")
    assert request.devices == ("/dev/kfd", "/dev/dri", "/dev/mkfd")
    assert request.group_add == ("video",)
    assert request.volumes == ("/opt/hyhal:/opt/hyhal:ro",)
    assert request.shm_size == "32g"
    assert request.network_mode == "none"
    assert request.command == ("python", "-m", "stackpin_verify", "--out-dir", "/stackpin-reports",
                               "--levels", "0,1", "--dtype", "bf16")
    assert request.mounts[0].source == tmp_path


def test_cpu_request_has_no_devices(shipped_cells, tmp_path: Path):
    request = verify_request(shipped_cells[CPU_CELL], "img", out_dir=tmp_path, levels="",
                             dtype="auto")
    assert request.devices == ()
    assert request.gpus == ""
    assert "--levels" not in request.command


def test_cuda_request_asks_for_gpus(shipped_cells, tmp_path: Path):
    request = verify_request(shipped_cells["cuda130-sm90-torch2110-py311"], "img", out_dir=tmp_path,
                             levels="", dtype="auto")
    assert request.gpus == "all"


def test_no_devices_drops_the_device_flags_and_tells_the_suite(shipped_cells, tmp_path: Path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "verify"))
    from stackpin_verify.level0 import NO_DEVICES_ENV

    cell = shipped_cells["cuda130-sm90-torch2110-py311"]
    request = verify_request(cell, "img", out_dir=tmp_path, levels="0", dtype="auto",
                             devices=False)
    assert (request.gpus, request.devices) == ("", ())
    # One name on both sides of the container boundary.
    assert request.environment[NO_DEVICES_ENV] == "1"
    assert NO_DEVICES_ENV not in verify_request(cell, "img", out_dir=tmp_path, levels="",
                                                dtype="auto").environment


def test_identical_reports_have_no_changes():
    assert diff_reports(_report(), _report()) == []


def test_status_version_and_throughput_changes_are_reported():
    after = copy.deepcopy(_report())
    after["versions"]["torch"] = "2.14.1+cpu"
    after["checks"][0]["metrics"]["tflops"] = 0.1
    after["checks"][1]["status"] = "fail"
    after["checks"][1]["reason"] = "loss did not fall"
    changes = {(c.kind, c.name): c for c in diff_reports(_report(), after)}
    assert changes[("version", "torch")].after == "2.14.1+cpu"
    assert changes[("metric", "L1.gemm.fp32.tflops")].note == "x0.500"
    status = changes[("status", "L5.lora.train")]
    assert status.note == "worse"
    assert is_regression(status)


def test_removed_check_is_a_regression():
    after = copy.deepcopy(_report())
    del after["checks"][1]
    (change,) = diff_reports(_report(), after)
    assert change.kind == "removed"
    assert is_regression(change)


def test_read_report_rejects_other_json(tmp_path: Path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"schema": "something/v9"}))
    with pytest.raises(VerificationError, match="not a stackpin verification report"):
        read_report(path)


def test_verify_diff_cli_exit_code_on_regression(tmp_path: Path):
    before, after = tmp_path / "a.json", tmp_path / "b.json"
    before.write_text(json.dumps(_report()))
    worse = _report()
    worse["checks"][0]["status"] = "fail"
    after.write_text(json.dumps(worse))
    result = CliRunner().invoke(cli, ["verify", "diff", str(before), str(after), "--fail-on-regression"])
    assert result.exit_code == 6
    assert "L1.gemm.fp32: pass -> fail (worse)" in result.output


def test_verify_help_shows_both_actions():
    result = CliRunner().invoke(cli, ["verify", "--help"])
    assert result.exit_code == 0
    assert "stackpin verify diff A.json B.json" in result.output


def test_no_devices_also_drops_the_device_hosts_mounts(shipped_cells, tmp_path: Path):
    # /opt/hyhal is the DCU host's driver side: with no card there is none, and Docker
    # would make an empty host folder and hide the image's own /opt/hyhal.
    cell = shipped_cells["dtk2604-k100-torch290-py310"]
    assert cell.run.volumes
    request = verify_request(cell, "img", out_dir=tmp_path, levels="0", dtype="auto",
                             devices=False)
    assert (request.devices, request.volumes) == ((), ())
    assert request.shm_size == cell.run.shm_size  # the rest of the profile stays
    assert request.ulimits == ("stack=-1:-1",)  # memlock pins memory for cards only
    with_devices = verify_request(cell, "img", out_dir=tmp_path, levels="0", dtype="auto")
    assert with_devices.volumes == cell.run.volumes
