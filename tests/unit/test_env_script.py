"""The cell's env script reaches every process of an image, run for real by bash and sh.

The rendered /opt/stackpin/env.sh and entrypoint are pointed at a stand-in env script in a
temporary folder (the DTK one lives in the vendor base); the shells are the host's.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.synthetic import synthetic_cells, synthetic_lock
from tests.tools import need_tool

from stackpin.context import read_sources
from stackpin.render import RenderRequest, render, render_template

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"


@pytest.fixture
def image(tmp_path: Path) -> dict[str, Path]:
    """env.sh and entrypoint.sh rendered for a cell whose env script appends to PATH."""
    script = tmp_path / "dtk" / "env.sh"
    script.parent.mkdir()
    script.write_text('export DTK_ROOT=/opt/dtk\nexport PATH="$PATH:/opt/dtk/bin"\n')
    cell = SimpleNamespace(env_script=str(script))
    files = {}
    for name in ("env.sh", "entrypoint.sh"):
        files[name] = tmp_path / name
        files[name].write_text(render_template(read_sources(TEMPLATES), f"{name}.j2", {"cell": cell}))
    return {**files, "script": script}


def _shell(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": "/usr/bin:/bin", **env}
    return subprocess.run(argv, capture_output=True, text=True, env=clean, timeout=30,
                          check=False)


def test_docker_exec_shells_source_it_through_bash_env_and_env(image):
    need_tool("sh")
    for argv, variable in ((("bash", "-c", "echo $DTK_ROOT"), "BASH_ENV"),
                           (("sh", "-i", "-c", "echo $DTK_ROOT"), "ENV")):
        done = _shell(*argv, env={variable: str(image["env.sh"])})
        assert done.stdout.strip() == "/opt/dtk", (argv, done.stderr)
        without = _shell(*argv, env={})
        assert without.stdout.strip() == ""  # what a shell sees when nothing sources it


def test_the_entrypoint_sources_it_for_the_command_and_the_healthcheck(image):
    done = _shell("bash", str(image["entrypoint.sh"]), "sh", "-c", "echo $DTK_ROOT", env={})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/opt/dtk"
    image["script"].unlink()
    done = _shell("bash", str(image["entrypoint.sh"]), "true", env={})
    assert done.returncode == 66
    assert f"{image['script']} not found" in done.stderr


def test_a_nested_shell_does_not_source_it_twice(image):
    nested = 'bash -c "echo \\$PATH"'
    done = _shell("bash", "-c", nested, env={"BASH_ENV": str(image["env.sh"])})
    assert done.stdout.strip().split(":").count("/opt/dtk/bin") == 1, done.stdout


def test_a_shell_without_the_script_says_so_and_still_runs(image):
    image["script"].unlink()
    done = _shell("bash", "-c", "echo ran", env={"BASH_ENV": str(image["env.sh"])})
    assert done.stdout.strip() == "ran"
    assert f"{image['script']} not found" in done.stderr


def test_only_a_cell_with_an_env_script_gets_the_shell_hooks():
    cells = synthetic_cells()
    dtk, cpu = cells["synth-dtk"], cells["synth-cpu"]

    def rendered(cell):  # type: ignore[no-untyped-def]
        return render(RenderRequest(cell=cell, variant="stable", lock=synthetic_lock(cell),
                                    sources=read_sources(TEMPLATES), stackpin_version="0"))

    with_script = rendered(dtk)
    assert "stackpin/env.sh" in with_script.files
    for line in ("BASH_ENV=/opt/stackpin/env.sh", "ENV=/opt/stackpin/env.sh",
                 "COPY --from=install /opt/stackpin/etc/ /etc/",
                 "cp /opt/stackpin/env.sh /opt/stackpin/etc/profile.d/stackpin-env.sh",
                 "echo '[ -r /opt/stackpin/env.sh ] && . /opt/stackpin/env.sh'; }"
                 " > /opt/stackpin/etc/bash.bashrc"):
        assert line in with_script.dockerfile, line
    plain = rendered(replace(cpu, env_script=""))
    assert "stackpin/env.sh" not in plain.files
    assert "BASH_ENV" not in plain.dockerfile and "/opt/stackpin/etc" not in plain.dockerfile
