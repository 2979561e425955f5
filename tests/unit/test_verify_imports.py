"""L0.imports: each declared module imported in a fresh interpreter, failures named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from verify_helpers import cpu_context

from stackpin_verify import imports
from stackpin_verify.checks import CheckFailed, Skip


def test_a_module_that_imports_passes() -> None:
    assert imports.import_one("json", {"PATH": "/usr/bin"}) is None


def test_a_missing_module_fails_with_pythons_own_line() -> None:
    error = imports.import_one("stackpin_no_such_module", {})
    assert error == "ModuleNotFoundError: No module named 'stackpin_no_such_module'"


def test_a_module_that_raises_at_import_is_caught_in_its_own_interpreter(tmp_path: Path) -> None:
    # What a wheel built for another CUDA does: installed, found, and failing on import.
    (tmp_path / "broken_ext.py").write_text("raise ImportError('libcudart.so.12: cannot open')\n")
    error = imports.import_one("broken_ext", {"PYTHONPATH": str(tmp_path)})
    assert error == "ImportError: libcudart.so.12: cannot open"
    assert "broken_ext" not in sys.modules  # the check's own process never imported it


def test_a_crash_in_native_code_is_a_failure_not_a_pass(tmp_path: Path) -> None:
    (tmp_path / "segv.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    error = imports.import_one("segv", {"PYTHONPATH": str(tmp_path)})
    assert error is not None and error.startswith("exit code -11")


def test_judge_names_every_failed_module() -> None:
    assert imports.judge_imports({"torch": None, "triton": None}) is None
    reason = imports.judge_imports({"torch": None, "triton": "ImportError: x", "a": "E: y"})
    assert reason == "declared modules do not import: a: E: y; triton: ImportError: x"


def test_unsloths_cpu_backend_only_off_a_device() -> None:
    off = imports.import_env({"A": "1"}, accelerated=False)
    on = imports.import_env({"A": "1", "UNSLOTH_DISABLE_CPU_FALLBACK": "1"}, accelerated=True)
    assert off == {"A": "1", "UNSLOTH_DISABLE_CPU_FALLBACK": "0"}
    assert on["UNSLOTH_DISABLE_CPU_FALLBACK"] == "1"


def test_check_fails_on_a_declared_module_that_does_not_import(tmp_path: Path) -> None:
    ctx = cpu_context(image={"imports": ["json", "stackpin_no_such_module"]})
    with pytest.raises(CheckFailed) as failed:
        imports.check_imports(ctx)
    assert failed.value.metrics["failed"] == ["stackpin_no_such_module"]
    assert imports.check_imports(ctx, ["json"])["failed"] == []


def test_no_declaration_is_a_skip_not_a_pass() -> None:
    with pytest.raises(Skip):
        imports.check_imports(cpu_context(image=None))
