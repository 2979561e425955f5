"""The package run as a program: without stackpin importable, report files, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import verify_helpers

from stackpin_verify import schema

# Isolated mode (-I) ignores PYTHONPATH and the user site; stackpin is still installed in
# this environment, so a meta-path hook makes importing it fail loudly, and the run
# asserts at exit that nothing imported it.
BOOT = f"""
import importlib.abc, runpy, sys

class NoStackpin(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "stackpin" or name.startswith("stackpin."):
            raise ModuleNotFoundError("stackpin must not be imported by stackpin_verify")
        return None

sys.meta_path.insert(0, NoStackpin())
sys.path.insert(0, {str(verify_helpers.VERIFY_DIR)!r})
sys.argv = ["stackpin_verify", *sys.argv[1:]]
try:
    runpy.run_module("stackpin_verify", run_name="__main__", alter_sys=True)
finally:
    leaked = sorted(m for m in sys.modules if m == "stackpin" or m.startswith("stackpin."))
    print("STACKPIN_MODULES=" + ",".join(leaked))
"""


def _isolated(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-c", BOOT, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def _module(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(verify_helpers.VERIFY_DIR))
    return subprocess.run(
        [sys.executable, "-m", "stackpin_verify", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_levels_0_1_without_stackpin_write_a_valid_report(tmp_path):
    done = _isolated("--levels", "0,1", "--out-dir", "tmp", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "STACKPIN_MODULES=\n" in done.stdout
    report = json.loads((tmp_path / "tmp" / "report.json").read_text())
    assert schema.validate(report, schema.load_schema()) == []
    names = [check["name"] for check in report["checks"]]
    assert {"L0.torch_version", "L0.numpy", "L1.gemm.fp32", "L1.gemm.bf16"} <= set(names)
    assert {check["level"] for check in report["checks"]} == {0, 1}
    gemm = next(c for c in report["checks"] if c["name"] == "L1.gemm.fp32")
    assert gemm["status"] == "pass"
    assert gemm["metrics"]["runs"] >= 5
    assert gemm["metrics"]["tflops"] > 0
    assert len(gemm["metrics"]["shape"]) == 3
    assert report["versions"]["torch"] == str(verify_helpers.torch.__version__)
    suites = ET.parse(tmp_path / "tmp" / "report.xml").getroot().findall("testsuite")
    assert [suite.get("name") for suite in suites] == ["L0", "L1"]
    assert "L1.gemm.fp32" in done.stdout
    assert "per level: L0 " in done.stdout


def test_required_failure_exits_1_and_json_flag_prints_the_report(tmp_path):
    image = verify_helpers.image_info(torch="2.13.0+das.opt1.dtk2604", numpy="<1")
    (tmp_path / "image.json").write_text(json.dumps(image))
    done = _module(
        "--levels", "0", "--image-info", "image.json", "--out-dir", "out", "--json", cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads((tmp_path / "out" / "report.json").read_text())
    assert printed["image"]["torch"] == "2.13.0+das.opt1.dtk2604"
    failed = {c["name"]: c["reason"] for c in printed["checks"] if c["status"] == "fail"}
    assert set(failed) == {"L0.torch_version", "L0.numpy"}
    assert "pinned 'das.opt1.dtk2604'" in failed["L0.torch_version"]
    assert printed["summary"]["required_failed"] == 2


def test_usage_errors_exit_2(tmp_path):
    bad_level = _module("--levels", "0,9", cwd=tmp_path)
    assert bad_level.returncode == 2
    assert "unknown level(s) [9]" in bad_level.stderr
    missing = _module("--image-info", "nope.json", cwd=tmp_path)
    assert missing.returncode == 2
    assert "--image-info nope.json does not exist" in missing.stderr
    assert not (tmp_path / "verify-report").exists()
