"""`build`, `bundle export` and `verify` through the CLI, against the shared fake engine.

Every verb reaches its engine through ``stackpin.cli.common.ENGINE``; here that seam holds
``tests/fake_engine.FakeEngine``, so each verb runs its whole path (checks, staging,
requests, records, reports, the bundle on disk) without a daemon, and the tests assert on
the requests the engine received and on what the verb left behind.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import verify_helpers  # noqa: F401 - puts verify/ on sys.path: the suite's report writer
from click.testing import CliRunner
from test_bundle_fakes import PROBE_OUTPUT, add_image, cpu_selection, engine_with_cpu
from test_exit_codes import locked_project
from tests.fake_engine import FakeEngine

from stackpin.cli.main import cli
from stackpin.engine import BuildRequest, RunRequest, RunResult
from stackpin.target import LABEL_CONTEXT_DIGEST, OCI_REVISION, Layout, Target
from stackpin_verify import report as suite_report
from stackpin_verify.checks import CheckResult

ROOT = Path(__file__).resolve().parents[2]
CPU_CELL = "cpu-bookworm-torch2130-py311"


def _invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# --- build -----------------------------------------------------------------------------


def _built(request: BuildRequest, count: int) -> tuple[dict[str, object], list[bytes]]:
    """What the fake 'builds': an image labelled as the request asks."""
    return ({"created": "2025-01-01T00:00:00Z",
             "config": {"Labels": dict(request.labels), "Env": ["PATH=/usr/bin"]}},
            [f"layer of build {count}".encode()])


def test_build_runs_the_whole_verb_on_the_engine_it_is_given(tmp_path, monkeypatch,
                                                             engine_seam):
    locked_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    engine = engine_seam(FakeEngine(recipe=_built, run_stdout="4096\t/opt/stackpin\n"))
    result = _invoke("build", "c1", "--builder", "classic", "--no-normalize")
    assert result.exit_code == 0, result.output
    assert "builder: classic (" in result.stderr
    (request,) = engine.builds
    assert request.network_mode == "none"  # every RUN step offline
    assert request.tags[0].startswith("stackpin/c1:stable-")
    assert {OCI_REVISION, LABEL_CONTEXT_DIGEST} <= set(request.labels)
    assert (request.context_dir / "Dockerfile").is_file()  # staged before the build
    assert engine.pulled == ["debian:bookworm"]  # the base, made present first
    (measure,) = engine.runs  # one container measures the environment (and probes the SBOM)
    assert "du -sb /opt/stackpin" in measure.command[1] and measure.network_mode == "none"
    record = json.loads((tmp_path / "build" / "records" / "c1-stable.json").read_text())
    assert record["image_id"] == engine.tags[request.tags[0]]
    assert record["env_size"] == 4096
    assert f"build: {request.tags[0]} ({record['image_id'][7:19]}" in result.stdout


def test_build_json_prints_the_records_and_nothing_else(tmp_path, monkeypatch, engine_seam):
    locked_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    engine_seam(FakeEngine(recipe=_built, run_stdout="1\t/opt/stackpin\n"))
    result = _invoke("build", "c1", "--builder", "classic", "--no-normalize", "--json")
    assert result.exit_code == 0, result.output
    (record,) = json.loads(result.stdout)
    assert (record["cell"], record["variant"], record["builder"]) == ("c1", "stable", "classic")


def test_build_refuses_before_the_engine_is_reached(tmp_path, monkeypatch, engine_seam):
    locked_project(tmp_path)
    (tmp_path / "wheels" / "c1" / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
     ).write_bytes(b"not the locked torch")
    monkeypatch.chdir(tmp_path)
    engine = engine_seam(FakeEngine(recipe=_built))
    result = _invoke("build", "c1", "--builder", "classic")
    assert result.exit_code == 4, result.output
    assert (engine.builds, engine.pulled, engine.runs) == ([], [], [])


# --- verify ----------------------------------------------------------------------------


def _cpu_project(tmp_path: Path) -> Path:
    """The CPU default cell's matrix and lock, in a project of their own."""
    root = tmp_path / "project"
    (root / "pinning" / "locks").mkdir(parents=True)
    shutil.copy(ROOT / "pinning" / "cpu.toml", root / "pinning")
    shutil.copy(ROOT / "pinning" / "locks" / f"{CPU_CELL}.lock", root / "pinning" / "locks")
    return root


def _suite(status: str):  # type: ignore[no-untyped-def]
    """A container run that is the suite: it writes its report into the bind mount."""
    def run(request: RunRequest) -> RunResult:
        check = CheckResult(name="L0.python", level=0, required=True,
                            status=status)  # type: ignore[arg-type]
        built = suite_report.build_report(checks=[check], host={}, image=None, backend="cpu",
                                          versions={"python": "3.11", "torch": "2.13.0+cpu"},
                                          devices=[], duration_s=0.1)
        suite_report.write_reports(built, request.mounts[0].source)
        code = suite_report.exit_code(built)
        return RunResult(exit_code=code, timed_out=False, logs="suite ran", stdout="suite ran")
    return run


@pytest.mark.parametrize(("status", "code"), [("pass", 0), ("fail", 6)])
def test_verify_runs_the_suite_and_records_which_image_it_judged(
        tmp_path, monkeypatch, engine_seam, shipped_cells, status, code):
    root = _cpu_project(tmp_path)
    monkeypatch.chdir(root)
    selection = cpu_selection(shipped_cells)
    engine = engine_seam(FakeEngine(on_run=_suite(status)))
    image_id = add_image(engine, selection.cell, "stable", selection.lock.digest)
    stale = root / "build" / "reports" / f"{CPU_CELL}-stable" / "old.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    result = _invoke("verify", CPU_CELL, "--levels", "0", "--json")
    assert result.exit_code == code, result.output
    (run,) = engine.runs
    assert run.command[-2:] == ("--levels", "0") and run.network_mode == "none"
    assert not stale.exists()  # a fresh folder: last run's reports never pass for this one
    (summary,) = json.loads(result.stdout)
    assert summary["summary"]["required_failed"] == (status == "fail")
    target = Target(cell=selection.cell, variant=selection.variant, lock=selection.lock,
                    layout=Layout(root))
    verified = json.loads(target.layout.verified_path(CPU_CELL, "stable").read_text())
    assert verified["image_id"] == image_id


def test_verify_of_an_image_that_is_not_built_says_how_to_build_it(tmp_path, monkeypatch,
                                                                   engine_seam):
    monkeypatch.chdir(_cpu_project(tmp_path))
    engine = engine_seam(FakeEngine())
    result = CliRunner().invoke(cli, ["verify", CPU_CELL])
    assert result.exit_code == 8
    assert f"run 'stackpin build {CPU_CELL} --variant stable'" in result.stderr
    assert engine.runs == []


def test_verify_without_a_report_from_the_suite_is_a_verification_error(
        tmp_path, monkeypatch, engine_seam, shipped_cells):
    monkeypatch.chdir(_cpu_project(tmp_path))
    selection = cpu_selection(shipped_cells)
    engine = engine_seam(FakeEngine(run_stdout="Traceback: the suite died\n"))
    add_image(engine, selection.cell, "stable", selection.lock.digest)
    result = CliRunner().invoke(cli, ["verify", CPU_CELL])
    assert result.exit_code == 6
    assert "the suite wrote no report" in result.stderr


# --- bundle export ---------------------------------------------------------------------


def test_bundle_export_keeps_layer_frames_in_the_machine_cache_unless_told_not_to(
        tmp_path, monkeypatch, engine_seam, shipped_cells):
    from test_bundle_fakes import project, record_cpu_build

    root = project(tmp_path)
    shutil.copytree(ROOT / "pinning", root / "pinning")
    monkeypatch.chdir(root)
    engine = engine_seam(engine_with_cpu(shipped_cells, kind="classic"))
    record_cpu_build(root, engine, cpu_selection(shipped_cells))
    for cache, flags in (("kept", ()), ("untouched", ("--no-cache",))):
        monkeypatch.setenv("STACKPIN_CACHE_DIR", str(tmp_path / cache))
        result = _invoke("bundle", "export", CPU_CELL, "-o", str(tmp_path / cache / "b"),
                         *flags)
        assert result.exit_code == 0, result.output
    kept = sorted(p.name for p in (tmp_path / "kept").glob("frames/*/*.zst"))
    assert len(kept) == 1  # the one layer of the stable image the fake engine builds
    assert list((tmp_path / "untouched").glob("frames")) == []
    bundles = [(tmp_path / c / "b" / "images.tar.zst").read_bytes() for c in ("kept", "untouched")]
    assert bundles[0] == bundles[1]


def test_bundle_export_writes_the_bundle_from_the_engine_it_is_given(
        tmp_path, monkeypatch, engine_seam, shipped_cells):
    from test_bundle_fakes import project, record_cpu_build

    root = project(tmp_path)
    shutil.copytree(ROOT / "pinning", root / "pinning")
    monkeypatch.chdir(root)
    engine = engine_seam(engine_with_cpu(shipped_cells))
    record_cpu_build(root, engine, cpu_selection(shipped_cells))
    out = tmp_path / "bundle"
    result = _invoke("bundle", "export", CPU_CELL, "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    exported = json.loads(result.stdout)
    assert exported["out_dir"] == str(out)
    (image,) = exported["images"]
    assert image["profile"] == "stable"
    (saved,) = engine.saved  # one docker save stream, the image under both its tags
    assert sorted(saved.images) == sorted(image["tags"])
    assert (out / "images.tar.zst").stat().st_size > 0
    assert "BUNDLE_PLATFORMS=(cpu)" in (out / "bin" / "bundle.conf").read_text()
    (probe,) = [r for r in engine.runs if r.command[:1] == ("-c",)]
    assert probe.network_mode == "none"  # the SBOM probe ran in the image, offline
    sbom = json.loads((out / "sbom" / f"{CPU_CELL}-stable.cdx.json").read_text())
    assert "unsloth" in json.dumps(sbom) and "unsloth" in PROBE_OUTPUT
