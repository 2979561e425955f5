"""L0.imports: each declared module imported in a fresh interpreter, failures named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from verify_helpers import cpu_context

from stackpin_verify import imports
from stackpin_verify.checks import CheckFailed, Skip, run_check


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


# --- the children start with the run and are judged after the other levels ------------------


def test_the_imports_run_at_once_not_one_after_the_other(tmp_path: Path) -> None:
    """Two imports that each wait for the other to have started can only both succeed when
    their interpreters run at the same time."""
    for me, other in (("left", "right"), ("right", "left")):
        (tmp_path / f"{me}.py").write_text(
            "import pathlib, time\n"
            f"d = pathlib.Path({str(tmp_path)!r})\n"
            f"(d / '{me}.started').touch()\n"
            "for _ in range(600):\n"
            f"    if (d / '{other}.started').exists():\n"
            "        break\n"
            "    time.sleep(0.05)\n"
            "else:\n"
            f"    raise ImportError('{other} never started while {me} waited')\n"
        )
    probes = imports.launch(["left", "right"], {"PYTHONPATH": str(tmp_path)})
    assert {m: f.result(timeout=120) for m, f in probes.items()} == {"left": None, "right": None}


def _run_with_levels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, modules: list[str]):
    """L0 and L1 with a stand-in L1 that leaves a mark the declared imports can wait for."""
    from stackpin_verify import level1, runner

    def fake_level1(ctx):
        (tmp_path / "l1.ran").touch()
        return [run_check("L1.fake", lambda: {})]

    monkeypatch.setattr(level1, "run", fake_level1)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "waits_for_l1.py").write_text(
        "import pathlib, time\n"
        f"mark = pathlib.Path({str(tmp_path)!r}) / 'l1.ran'\n"
        "for _ in range(400):\n"
        "    if mark.exists():\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "else:\n"
        "    raise ImportError('L1 never ran while this import waited')\n"
    )
    ctx = cpu_context(image={"imports": modules})
    return runner.run_levels(ctx, [0, 1])


def test_runner_judges_the_imports_after_the_levels_and_reports_them_in_l0(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An import that finishes only once L1 has run passes only when the runner lets the
    levels run while the import children do (judging them inside L0 would wait 20 s and
    fail it)."""
    results, durations = _run_with_levels(
        monkeypatch, tmp_path, ["waits_for_l1", "stackpin_no_such_module"])
    names = [r.name for r in results]
    assert names.count("L0.imports") == 1
    assert names.index("L0.imports") < names.index("L1.fake")  # reported with L0
    check = results[names.index("L0.imports")]
    assert check.status == "fail" and check.level == 0
    assert check.metrics["failed"] == ["stackpin_no_such_module"]  # waits_for_l1 imported
    assert set(durations) == {0, 1}


def test_a_deferred_run_of_only_passing_imports_passes_l0(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    results, _ = _run_with_levels(monkeypatch, tmp_path, ["waits_for_l1", "json"])
    by_name = {r.name: r for r in results}
    assert by_name["L0.imports"].status == "pass", by_name["L0.imports"].reason
    assert "L0.level" not in by_name
