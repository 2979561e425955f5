"""The CPU default built end to end on the real daemon: tags, labels, hygiene, imports, faults."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, ROOT
from tests.tools import default_sigint

from stackpin.engine import RunRequest
from stackpin.engine.docker_api import DockerEngine
from stackpin.lock import read_lock

pytestmark = pytest.mark.docker


def run_in(engine: DockerEngine, image: str, *command: str) -> str:
    result = engine.run_to_completion(
        RunRequest(image=image, command=command, network_mode="none"), timeout_s=600
    )
    assert result.exit_code == 0, result.logs
    return result.stdout


def test_image_is_tagged_with_variant_and_lock_digest(cpu_image, docker_engine: DockerEngine):
    lock = read_lock(ROOT, CPU_CELL)
    assert lock is not None
    expected = {f"stackpin/{CPU_CELL}:stable-{lock.digest[:12]}", f"stackpin/{CPU_CELL}:stable"}
    info = docker_engine.image_info(str(cpu_image["image_id"]))
    assert info is not None
    assert expected <= set(info.tags)


def test_labels_are_present_and_parse(cpu_image, docker_engine: DockerEngine):
    info = docker_engine.image_info(str(cpu_image["image_id"]))
    assert info is not None
    labels = info.labels
    lock = read_lock(ROOT, CPU_CELL)
    assert lock is not None
    assert labels["io.stackpin.cell"] == CPU_CELL
    assert labels["io.stackpin.variant"] == "stable"
    assert labels["io.stackpin.lock-digest"] == lock.digest
    assert json.loads(labels["io.stackpin.cell-json"])["python"] == "cp311"
    assert labels["org.opencontainers.image.revision"]


def test_pinned_versions_import(cpu_image, docker_engine: DockerEngine, shipped_cells):
    out = run_in(
        docker_engine, str(cpu_image["image_id"]), "python", "-c",
        "import torch, transformers, peft, trl, numpy; "
        "print(torch.__version__, transformers.__version__, peft.__version__, trl.__version__, numpy.__version__)",
    )
    stack = shipped_cells[CPU_CELL].stack
    assert out.split() == ["2.13.0+cpu", *(stack[n] for n in ("transformers", "peft", "trl", "numpy"))]


def test_no_wheel_cache_or_apt_list_in_the_image(cpu_image, docker_engine: DockerEngine):
    out = run_in(
        docker_engine, str(cpu_image["image_id"]), "bash", "-c",
        # apt keeps an empty lock file and partial/ folder; any list or package is a leak.
        "find /opt/stackpin /root /tmp /var/lib/apt/lists /var/cache/apt -mindepth 1 "
        "\\( -name '*.whl' -o -path '/root/.cache*' -o -path '/tmp/*' -o -name '*.deb' "
        "-o -path '/var/lib/apt/lists/*' -type f ! -name lock \\) -print",
    )
    assert out.strip() == ""


def test_history_has_no_layer_carrying_the_wheelhouse(cpu_image):
    history = subprocess.run(
        ["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", str(cpu_image["image_id"])],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    copies = [line.rsplit(" in ", 1)[1].strip() for line in history if "COPY " in line]
    # Only the finished environment and the verify package are copied into the final image.
    assert copies == ["/opt/stackpin/verify/", "/opt/stackpin"]
    # No step of the final image installed anything (LABEL lines carry the cell JSON,
    # which names the wheel filenames, so they are not steps to look at).
    steps = [line for line in history if "LABEL" not in line]
    assert not any("pip install" in line or ".whl" in line for line in steps)


def test_size_is_within_five_percent_of_base_plus_environment(cpu_image):
    base, env, size = (int(cpu_image[k]) for k in ("base_size", "env_size", "image_size"))
    assert env > 500 * 2**20, "the environment holds torch"
    assert size <= 1.05 * (base + env)


def test_entrypoint_execs_the_command(cpu_image, docker_engine: DockerEngine):
    assert run_in(docker_engine, str(cpu_image["image_id"]), "echo", "hello").strip() == "hello"


def test_images_lists_the_build(cpu_image, cpu_project: Path):
    done = subprocess.run(
        [sys.executable, "-m", "stackpin.cli.main", "images", "--json"],
        cwd=cpu_project, capture_output=True, text=True, check=True,
    )
    rows = {row["id"]: row for row in json.loads(done.stdout)}
    row = rows[str(cpu_image["image_id"])]
    assert row["cell"] == CPU_CELL
    assert row["overhead"] is not None and row["overhead"] <= 1.05


@pytest.fixture
def project_copy(tmp_path: Path, cpu_image, cpu_project: Path) -> Path:
    """A copy of the project sharing the session copy's wheelhouse, for builds that must fail."""
    for folder in ("pinning", "templates", "verify"):
        shutil.copytree(cpu_project / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "wheels").symlink_to(cpu_project / "wheels")
    return tmp_path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stackpin.cli.main", *args],
        cwd=cwd, capture_output=True, text=True, check=False,
    )


def test_failing_step_gives_build_exit_code_step_and_log(project_copy: Path):
    guard = project_copy / "templates" / "fragments" / "guard.j2"
    # Fail right after the guard's checks (the install steps below it are the session
    # build's, cached), since only the failing step's report is under test.
    text = guard.read_text()
    assert "&& rm -rf /root/.cache /tmp/*" in text
    guard.write_text(text.replace("&& rm -rf /root/.cache /tmp/*", "&& false"))
    done = _cli("build", cwd=project_copy)
    assert done.returncode == 5, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("stackpin: build error: build failed at Step ")
    assert "guard.py" in line
    log = project_copy / "build" / "logs" / f"{CPU_CELL}-stable.log"
    assert f"full log: {log}" in line
    assert "returned a non-zero code" in log.read_text()


def test_ctrl_c_during_build_leaves_no_container(project_copy: Path, docker_engine: DockerEngine):
    before = set(subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True,
                                check=True).stdout.split())
    locks = project_copy / "pinning" / "locks"
    locks_before = {p.name: p.read_bytes() for p in locks.iterdir()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stackpin.cli.main", "build", "--no-cache", "-v"],
        cwd=project_copy, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=default_sigint,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # interrupt while a RUN step's container is alive
        if line.startswith(" ---> Running in"):
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, rest
    assert "interrupted" in rest
    for _ in range(60):  # the daemon removes the step's container once the client is gone
        after = set(subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True,
                                   check=True).stdout.split())
        if after <= before:
            break
        time.sleep(1)
    assert after <= before, f"left behind: {after - before}"
    assert not (project_copy / "build" / "records" / f"{CPU_CELL}-stable.json").exists()
    # Every cell has a committed lock: the interrupted build wrote and changed none of them.
    assert {p.name: p.read_bytes() for p in locks.iterdir()} == locks_before
