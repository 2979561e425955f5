"""The vendor rehearsal, end to end (issue 21 item 3): every DTK and ROCm cell's images built
from stand-ins through the same CLI and Dockerfiles as a real cell, on the default engine.

Inside each image: the guard passed (the build), the vendor boundary and L0 pass with no
device (``verify --levels 0 --no-devices``: the backend and devices say "unsupported", never
pass), the structure is the lock's, the env script reaches every shell, the vendor tree's
linker is Debian's real one and its tools say they are stand-ins; Studio starts on its CPU
fallback and answers health where the cell holds Studio (DTK 24.04 cannot and says so). Every
image says it is a rehearsal: its label, its reports' run kind, its grid row, and `bundle
export` refuses it unless named. None of this is a DCU or AMD run.

One cell at a time (the module fixture is parametrized): built, checked, removed. In CI:
the six builds are its largest cost (docs/benchmarks.md, "The vendor rehearsal in CI").
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra
from tests.conftest import ROOT, stackpin_cli
from tests.integration.loopback import free_port
from tests.integration.rehearsal_builds import CELLS, DTK2404, Built, RehearsalBuilds
from tests.tools import default_sigint

from stackpin import rehearsal
from stackpin.lock import read_lock
from stackpin.target import LABEL_REHEARSAL

sys.path.insert(0, str(ROOT / "verify"))
from stackpin_verify.studio_api import Studio

pytestmark = pytest.mark.docker



@pytest.fixture(scope="module", params=CELLS)
def rehearsed(request: pytest.FixtureRequest, rehearsal_builds: RehearsalBuilds
              ) -> Iterator[Built]:
    built = rehearsal_builds.get(request.param)
    yield built
    rehearsal_builds.drop(request.param)


def _host(built: Built, variant: str) -> Iterator[testinfra.host.Host]:
    name = f"stackpin-rehearsal-{built.cell[-24:]}-{variant}"
    subprocess.run(["docker", "run", "-d", "--rm", "--network", "none", "--name", name,
                    built.image(variant), "sleep", "infinity"], check=True, capture_output=True)
    try:
        yield testinfra.get_host(f"docker://{name}")
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def stable_host(rehearsed: Built) -> Iterator[testinfra.host.Host]:
    yield from _host(rehearsed, "stable")


def test_the_guard_of_every_variant_passes_again_on_the_finished_image(rehearsed: Built,
                                                                      shipped_cells):
    # The build ran it (a failing guard fails the build); here the very RUN line of the
    # recorded Dockerfile runs again in the finished image, less the byte-compile.
    cell = rehearsal.load_derived(ROOT, shipped_cells)[rehearsed.cell]
    assert set(rehearsed.records) == {str(v) for v in cell.variants}
    for variant in rehearsed.records:
        dockerfile = (rehearsed.project / "build" / "records" /
                      f"{rehearsed.cell}-{variant}.Dockerfile").read_text()
        command = _guard_command(dockerfile)
        assert f"--torch {cell.provided['torch'].version}" in command
        assert ("--env-script /opt/dtk/env.sh" in command) == bool(cell.env_script)
        done = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint",
                               "bash", rehearsed.image(variant), "-c", command],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(
            f"stackpin guard: python cp311, torch {cell.provided['torch'].version}, "
            f"numpy{cell.numpy}: ok")


def _guard_command(dockerfile: str) -> str:
    """The guard's step of a Dockerfile (with the `source` of the env script before it, where
    the cell has one), continuation lines joined. The classic Dockerfile
    gives the guard a RUN of its own; the one-stage (BuildKit) one runs it among the copies
    of its RUN, which need the build context and are left out."""
    text = dockerfile.replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("RUN ") and "guard.py" in ln]
    steps = [step.strip().removeprefix("RUN ") for step in line.split(" && ")]
    at = next(n for n, step in enumerate(steps) if "/opt/stackpin/guard.py" in step)
    first = at - 1 if at and steps[at - 1].startswith("source ") else at
    return " && ".join(steps[first:at + 1])


def test_every_image_says_it_is_a_rehearsal_of_its_real_cell(rehearsed: Built, docker_engine,
                                                            shipped_cells):
    real = rehearsal.load_derived(ROOT, shipped_cells)[rehearsed.cell].rehearsal.of
    for variant in rehearsed.records:
        labels = docker_engine.image_info(rehearsed.image(variant)).labels
        assert labels["io.stackpin.cell"] == rehearsed.cell
        assert labels[LABEL_REHEARSAL].startswith(f"vendor rehearsal of {real}:")
        assert "not a " in labels[LABEL_REHEARSAL]
        assert json.loads(labels["io.stackpin.cell-json"])["rehearsal"]["of"] == real


@pytest.fixture(scope="module")
def l0_reports(rehearsed: Built) -> dict[str, dict[str, object]]:
    """``stackpin verify CELL --levels 0 --no-devices``: the reports by variant."""
    done = stackpin_cli("verify", rehearsed.cell, "--levels", "0", "--no-devices", "--json",
                        cwd=rehearsed.project)
    assert done.returncode == 0, done.stdout + done.stderr
    return {variant: json.loads((rehearsed.project / "build" / "reports" /
                                 f"{rehearsed.cell}-{variant}" / "report.json").read_text())
            for variant in rehearsed.records}


def test_l0_passes_inside_every_image_with_no_device_and_the_report_says_rehearsal(
        rehearsed: Built, l0_reports):
    for variant, report in l0_reports.items():
        checks = {c["name"]: c for c in report["checks"]}
        assert report["summary"]["required_failed"] == 0
        assert report["image"]["run_kind"] == "vendor rehearsal"
        passed = {"L0.image_info", "L0.torch_version", "L0.numpy", "L0.pins", "L0.boundary",
                  "L0.imports", "L0.path"}
        assert {n for n in passed if checks[n]["status"] == "pass"} == passed, checks
        for name in ("L0.backend", "L0.devices"):  # no card here: never a pass
            assert checks[name]["status"] == "skip"
            assert checks[name]["reason"].startswith("unsupported: no device")
        dtk = rehearsed.cell.startswith("rehearsal-dtk")
        assert checks["L0.dtk_env"]["status"] == ("pass" if dtk else "skip")
        if variant == "enhanced":  # the stand-in FlashAttention imports
            assert "flash_attn" in checks["L0.imports"]["metrics"]["modules"]


def test_the_reports_are_rehearsal_rows_of_the_grid(rehearsed: Built, l0_reports,
                                                    tmp_path: Path):
    reports = rehearsed.project / "build" / "reports"
    done = stackpin_cli("report", "grid", str(reports), "-o", str(tmp_path / "grid"),
                        cwd=rehearsed.project)
    assert done.returncode == 0, done.stderr
    grid = json.loads((tmp_path / "grid" / "grid.json").read_text())
    rows = [r for r in grid["rows"] if r["cell"] == rehearsed.cell]
    assert len(rows) == len(l0_reports)
    assert all(r["id"].endswith("~rehearsal") and r["label"].endswith("(vendor rehearsal)")
               for r in rows), rows


def test_every_installed_distribution_is_the_locks_and_each_vendor_one_a_marked_stand_in(
        rehearsed: Built, stable_host):
    lock = read_lock(rehearsed.project, rehearsed.cell)
    out = stable_host.check_output(
        "/opt/stackpin/venv/bin/python -c 'import importlib.metadata as m, json; print(json.dumps("
        "{d.metadata[\"Name\"]: [d.version, d.read_text(\"STACKPIN_REHEARSAL\")] "
        "for d in m.distributions()}))'")
    from packaging.utils import canonicalize_name

    installed = {str(canonicalize_name(k)): v for k, v in json.loads(out).items()}
    stable = {w.name: w.version for w in lock.wheels if w.group in ("vendor", "stack")}
    for own in ("pip", "setuptools"):  # the venv's own, from Debian's python3-venv, unless
        if own not in stable:          # the lock pins it (BW's stack does: setuptools 84.2.1)
            installed.pop(own, None)
    assert {k: v[0] for k, v in installed.items()} == stable
    for wheel in lock.vendor_files():
        if wheel.group == "vendor":
            marker = installed[wheel.name][1]
            assert marker.startswith("stackpin vendor rehearsal stand-in for "), wheel.name
    assert all(installed[n][1] is None for n in stable if n not in
               {w.name for w in lock.vendor_files()})
    torch = stable_host.check_output("python -c 'import torch; print(torch.__version__)'")
    assert torch == lock.pins()["torch"]  # the vendor's label, from the stand-in's version.py


def test_the_env_script_reaches_exec_shells_and_the_tree_holds_real_and_marked_parts(
        rehearsed: Built, stable_host):
    if not rehearsed.cell.startswith("rehearsal-dtk"):
        # ROCm declares no env script: its tools come through the base's PATH.
        assert "stand-in" in stable_host.run("rocm-smi").stderr
        assert stable_host.run("rocm-smi").rc == 69
        return
    # docker exec shells, not the entrypoint: bash -c through BASH_ENV, login shells
    # through profile.d, interactive sh through ENV. (A plain `sh -c` reads none: dash.)
    for shell in ("bash -c", "bash -l -c", "sh -i -c"):
        assert stable_host.check_output(f"{shell} 'echo $ROCM_PATH' 2>/dev/null") == "/opt/dtk"
    lld = stable_host.check_output("bash -c '$TRITON_HIP_LLD_PATH --version'")
    assert lld.startswith("Debian LLD ")  # a real linker, named exactly ld.lld
    smi = stable_host.run("hy-smi")
    assert smi.rc == 69 and "stand-in" in smi.stderr and "no device" in smi.stderr


def test_no_wheel_cache_or_apt_list_in_the_image(stable_host):
    assert stable_host.check_output(
        "find / -xdev -name '*.whl' -not -path '/usr/share/python-wheels/*'") == ""
    assert not stable_host.file("/root/.cache/pip").exists


def test_studio_answers_health_on_the_cpu_fallback_where_the_cell_holds_it(
        rehearsed: Built, tmp_path: Path):
    info = json.loads(subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat",
         rehearsed.image("stable"), "/opt/stackpin/image.json"],
        capture_output=True, text=True, check=True).stdout)
    if rehearsed.cell == DTK2404:
        # The real cell says why in matrix check; its rehearsal image carries no service.
        assert info["service"] is None
        done = stackpin_cli("serve", rehearsed.cell, "--no-devices", cwd=rehearsed.project)
        assert done.returncode == 3 and "declares no service" in done.stderr
        return
    for variant in rehearsed.records:
        _serve_until_healthy(rehearsed, variant, tmp_path / variant)


def _serve_until_healthy(rehearsed: Built, variant: str, state: Path) -> None:
    models = state / "models"
    models.mkdir(parents=True)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stackpin.cli.main", "serve", rehearsed.cell, "--variant",
         variant, "--no-devices", "--port", str(port), "--models", str(models), "--state",
         str(state / "state"), "--json"],
        cwd=rehearsed.project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "serve printed nothing"
        served = json.loads(line)
        health = Studio(served["url"].rstrip("/")).health()
        assert health["status"] == "healthy" and health["service"] == "Unsloth UI Backend"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    assert proc.returncode == 130


def test_bundle_export_refuses_the_rehearsal_image_and_writes_nothing(rehearsed: Built,
                                                                       tmp_path: Path):
    out = tmp_path / "bundle"
    done = stackpin_cli("bundle", "export", rehearsed.cell, "-o", str(out),
                        cwd=rehearsed.project)
    assert done.returncode == 7, done.stdout + done.stderr
    assert "vendor rehearsal image" in done.stderr
    assert f"--allow-rehearsal {rehearsed.cell}" in done.stderr
    assert not out.exists()
