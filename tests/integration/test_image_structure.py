"""Image structure tests (pytest-testinfra's Docker backend) and the suite run through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra
from tests.conftest import CPU_CELL, ROOT

from stackpin.engine import RunRequest
from stackpin.engine.docker_api import DockerEngine
from stackpin.lock import read_lock

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def host(cpu_image, docker_engine: DockerEngine) -> Iterator[testinfra.host.Host]:
    request = RunRequest(image=str(cpu_image["image_id"]), entrypoint=("sleep",),
                         command=("infinity",), network_mode="none")
    with docker_engine.container(request) as running:
        yield testinfra.get_host(f"docker://{running.name}")


def test_every_installed_distribution_matches_the_lock(host):
    lock = read_lock(ROOT, CPU_CELL)
    assert lock is not None
    out = host.check_output(
        "/opt/stackpin/venv/bin/python -c 'import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata[\"Name\"]: d.version for d in m.distributions()}))'"
    )
    from packaging.utils import canonicalize_name

    installed = {str(canonicalize_name(k)): v for k, v in json.loads(out).items()}
    installed.pop("pip", None)  # the venv's own pip comes from Debian's python3-venv
    assert installed == lock.pins()


def test_torch_local_label_equals_the_pin(host):
    version = host.check_output("python -c 'import torch; print(torch.__version__)'")
    assert version == "2.13.0+cpu"


def test_numpy_constraint_holds(host):
    major = host.check_output("python -c 'import numpy; print(numpy.__version__.split(\".\")[0])'")
    assert int(major) < 2


def test_no_pip_cache_wheels_or_apt_lists(host):
    assert not host.file("/root/.cache/pip").exists
    assert host.check_output("find / -xdev -name '*.whl' -not -path '/usr/share/python-wheels/*'") == ""
    assert host.check_output("find /var/lib/apt/lists -type f ! -name lock") == ""


def test_entrypoint_and_image_json(host):
    entry = host.file("/opt/stackpin/entrypoint.sh")
    assert entry.mode & 0o111
    assert 'exec "$@"' in entry.content_string
    assert "source" not in entry.content_string, "the CPU cell has no DTK env script"
    info = json.loads(host.file("/opt/stackpin/image.json").content_string)
    assert info["cell"] == CPU_CELL
    assert info["torch"] == "2.13.0+cpu"


def test_labels_parse(cpu_image, docker_engine: DockerEngine):
    info = docker_engine.image_info(str(cpu_image["image_id"]))
    assert info is not None
    cell = json.loads(info.labels["io.stackpin.cell-json"])
    assert cell["id"] == info.labels["io.stackpin.cell"] == CPU_CELL
    assert int(info.labels["io.stackpin.source-date-epoch"]) == cell["source_date_epoch"]


def test_stackpin_verify_passes_and_writes_reports(cpu_image, cpu_project: Path):
    done = subprocess.run(
        [sys.executable, "-m", "stackpin.cli.main", "verify", CPU_CELL],
        cwd=cpu_project, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out_dir = cpu_project / "build" / "reports" / f"{CPU_CELL}-stable"
    report = json.loads((out_dir / "report.json").read_text())
    assert report["schema"] == "stackpin.verify/v1"
    assert report["image"]["cell"] == CPU_CELL
    assert report["summary"]["required_failed"] == 0
    names = {c["name"] for c in report["checks"] if c["status"] == "pass"}
    assert {"L0.torch_version", "L5.lora.train", "L5.unsloth_cpu", "L6.golden.fp32",
            "L7.allreduce", "L8.service.chat"} <= names
    assert (out_dir / "report.xml").read_text().startswith("<?xml")
    assert "verify: stackpin/" in done.stdout

