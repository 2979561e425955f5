"""The CLI through click's runner: exit codes, one-line errors, --json, nothing written on failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.conftest import CPU_CELL, K100_CELL, ROOT

from stackpin.cli.main import cli
from stackpin.cli.matrix_cmd import reference_markdown

FIXTURES = Path(__file__).parent / "fixtures"


def run(*args: str, cwd: Path = ROOT):
    with _chdir(cwd):
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)


class _chdir:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        import os

        self.old = Path.cwd()
        os.chdir(self.path)

    def __exit__(self, *exc: object) -> None:
        import os

        os.chdir(self.old)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's data folders, so a test may break or write them."""
    for folder in ("pinning", "templates", "verify"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_help_lists_exit_codes():
    result = run("--help")
    assert result.exit_code == 0
    assert "3 configuration, 4 validation, 5 build" in result.output


@pytest.mark.parametrize("verb", ["matrix", "wheel", "render", "lock", "wheels", "build", "images"])
def test_every_verb_has_help(verb: str):
    result = run(verb, "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.output


def test_matrix_check_passes_shipped_matrices_with_warnings():
    result = run("matrix", "check")
    assert result.exit_code == 0, result.output
    assert "0 error(s)" in result.output
    assert "WARN  dtk2604-k100-torch290-py310: torch.sha256" in result.output


def test_matrix_check_json_is_machine_readable():
    result = run("matrix", "check", "--json")
    data = json.loads(result.output)
    assert data["ok"] is True
    assert CPU_CELL in data["cells"]
    assert all(v["severity"] == "warning" for v in data["violations"])


def test_four_kinds_of_error_in_one_run(project: Path):
    broken = (FIXTURES / "dtk-broken.toml").read_text()
    broken = broken.replace('numpy = "<2"', 'numpy = "<2"\nnumpyy = "<2"', 1)
    (project / "broken.toml").write_text(broken)
    result = run("matrix", "check", "broken.toml", cwd=project)
    out = result.output
    assert result.exit_code == 3
    assert "perhaps you meant 'numpy'" in out
    assert "torch 2.9.0" in out and "torch 2.8.0" in out
    assert "cp311" in out and "cp310" in out
    assert "numpy<3" in out


def test_validation_only_errors_exit_4(project: Path):
    (project / "broken.toml").write_text((FIXTURES / "dtk-broken.toml").read_text())
    result = run("matrix", "check", "broken.toml", cwd=project)
    assert result.exit_code == 4
    assert result.output.count("ERROR ") == 3


def test_naming_a_missing_matrix_file_is_a_usage_error(project: Path):
    result = CliRunner().invoke(cli, ["matrix", "check", "nope.toml"])
    assert result.exit_code == 2
    (line,) = result.output.splitlines()
    assert line.startswith("stackpin: usage error: Invalid value for '[FILES]...': File "
                           "'nope.toml' does not exist. (see '")
    assert line.endswith(" matrix check --help')")  # the program's name, as invoked


def test_render_twice_gives_identical_bytes():
    first = run("render", K100_CELL, "--variant", "enhanced")
    second = run("render", K100_CELL, "--variant", "enhanced")
    assert first.exit_code == 0
    assert first.output == second.output
    assert "--no-deps" in first.output


def test_render_unknown_cell_suggests_and_exits_3():
    result = run("render", "cpu-bookworm-torch2130-py312")
    assert result.exit_code == 3
    assert "perhaps you meant 'cpu-bookworm-torch2130-py311'" in result.output
    assert "Traceback" not in result.output


def test_render_to_folder_writes_context_files(tmp_path: Path):
    result = run("render", CPU_CELL, "-o", str(tmp_path / "ctx"))
    assert result.exit_code == 0
    entry = tmp_path / "ctx" / "stackpin" / "entrypoint.sh"
    assert entry.stat().st_mode & 0o111
    assert (tmp_path / "ctx" / "wheels" / "vendor" / "requirements.txt").exists()


def test_wheel_inspect_json_has_contract_keys():
    result = run("wheel", "inspect", "--json", "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl")
    data = json.loads(result.output)
    assert set(data) >= {"dist", "version", "local", "python_tag", "abi_tag", "platform_tag",
                         "glibc", "vendor", "dtk", "torch", "cuda", "cxx11abi"}
    assert data["cuda"] == "12"
    assert data["torch"] == "2.8"
    assert data["cxx11abi"] is True


def test_wheel_inspect_bad_name_exits_4():
    result = run("wheel", "inspect", "not-a-wheel.zip")
    assert result.exit_code == 4
    assert result.output.startswith("stackpin: validation error:")


def test_build_refuses_unpinned_vendor_hash_before_docker(project: Path, monkeypatch):
    # No daemon at this address: reaching Docker would fail with exit 8, not 4.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = run("build", K100_CELL, cwd=project)
    assert result.exit_code == 4
    assert "is unpinned (empty sha256)" in result.output


def test_build_refuses_missing_lock_before_docker(project: Path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    (project / "pinning" / "locks" / f"{CPU_CELL}.lock").unlink()
    result = run("build", cwd=project)
    assert result.exit_code == 4
    assert f"run 'stackpin wheels fetch {CPU_CELL}' first" in result.output


def test_build_refuses_missing_wheelhouse_file(project: Path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = run("build", cwd=project)
    assert result.exit_code == 4
    assert "wheelhouse does not match the lock" in result.output
    assert "missing" in result.output


def test_images_without_daemon_says_how_to_start_one(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    result = run("images")
    assert result.exit_code == 8
    assert "no Docker daemon answers" in result.output
    assert len(result.output.strip().splitlines()) <= 2


def test_lock_refuses_a_cell_that_does_not_resolve_and_writes_nothing(
    project: Path, monkeypatch, tmp_path: Path
):
    from tests.unit.test_resolve import FIXTURES, Replay

    from stackpin.resolve import Pip

    monkeypatch.setenv("STACKPIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("stackpin.cli.lock_cmd.Pip", lambda: Pip(runner=Replay(
        "pin-outside-range")))
    cells = (FIXTURES / "cells.toml").read_text().split("[cells.excluded-transitive]")[0]
    (project / "pinning" / "extra.toml").write_text(cells)
    result = run("lock", "pin-outside-range", cwd=project)
    assert result.exit_code == 4
    assert "cannot lock: unsloth 2025.10.12 requires transformers" in result.output
    assert not (project / "pinning" / "locks" / "pin-outside-range.lock").exists()


def test_docs_matrix_md_is_current():
    assert (ROOT / "docs" / "matrix.md").read_text() == reference_markdown()


def test_schema_command_prints_json_schema():
    data = json.loads(run("matrix", "schema").output)
    assert data["properties"]["cells"]["type"] == "object"


def test_sigterm_unwinds_like_ctrl_c(tmp_path: Path):
    import signal
    import subprocess
    import sys

    marker = tmp_path / "cleaned"
    code = (
        "import sys, time\n"
        "from stackpin.cli.main import _interrupt_on_sigterm\n"
        "_interrupt_on_sigterm()\n"
        "try:\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n"
        "finally:\n"
        f"    open({str(marker)!r}, 'w').close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 130
    assert marker.exists(), "finally blocks ran"


def test_images_hides_untagged_builder_output():
    from stackpin.cli.images_cmd import built_images, image_row
    from stackpin.engine import ImageInfo

    def info(image_id: str, tags: tuple[str, ...]) -> ImageInfo:
        return ImageInfo(id=image_id, tags=tags, repo_digests=(), labels={
            "io.stackpin.cell": CPU_CELL, "io.stackpin.variant": "stable",
            "io.stackpin.lock-digest": "ab" * 32}, size=1100, created="", env=(), entrypoint=(),
            cmd=(), diff_ids=(), architecture="amd64", os="linux")

    raw, final = info("sha256:raw", ()), info("sha256:final", (f"stackpin/{CPU_CELL}:stable",))
    assert built_images([raw, final]) == [final]
    row = image_row(final, {"image_id": "sha256:final", "base_size": 100, "env_size": 1000})
    assert row.overhead == 1.0
    assert image_row(final, {"image_id": "sha256:other", "base_size": 1, "env_size": 1}).overhead is None


def test_cache_dir_is_machine_wide_and_overridable(tmp_path: Path):
    from stackpin.cache import cache_dir

    assert cache_dir({"STACKPIN_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/stackpin")
    assert cache_dir({}) == Path.home() / ".cache" / "stackpin"


def test_each_verb_is_its_modules_command_and_loads_alone():
    from stackpin.cli import registry

    for verb in registry.verbs():
        command = registry.load(verb)
        assert command is not None and command.name == verb
    assert registry.load("bogus") is None
    # a run imports only the verb it runs: the export does not pull in the build's modules
    import subprocess
    import sys
    code = ("import sys; from stackpin.cli import registry; registry.load('bundle'); "
            "print(sorted(m for m in sys.modules if m.startswith('stackpin.cli.')))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                            text=True).stdout
    assert "stackpin.cli.bundle_cmd" in loaded
    assert "stackpin.cli.build_cmd" not in loaded and "stackpin.cli.verify_cmd" not in loaded
