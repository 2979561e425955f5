"""The vendor rehearsal broken on purpose (issue 21 item 3): each break a careless Dockerfile
or lock could make fails the build (guard) or L0, by name.

Each break is built by the engine's BuildKit, as the rehearsal is, from the context `stackpin
build` staged for the DTK 24.04 rehearsal (the smallest; it has the env script, the vendor
tree and hyhal on the base's PATH), with one thing changed, as it would reach a site:

- the env script not sourced: the guard's build step without ``source /opt/dtk/env.sh``
  (every earlier layer comes from the cache), and an image run whose shells never source it;
- a PyPI torch in the vendor layer: the layer's requirements name the index torch (the CPU
  build, its real hash) where the vendor's stand-in was;
- the base PATH lost: the final ENV sets PATH outright instead of extending the base's.

And the one way a rehearsal image leaves as a bundle: `bundle export --allow-rehearsal CELL`.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import CPU_CELL, ROOT, stackpin_cli
from tests.integration.rehearsal_builds import DTK2404, Built, RehearsalBuilds

from stackpin.cache import cache_dir
from stackpin.engine import BindMount, BuildRequest, RunRequest
from stackpin.engine.docker_api import DockerEngine
from stackpin.errors import BuildError
from stackpin.matrixfile import load_cells
from stackpin.target import Layout, load_cell

pytestmark = pytest.mark.docker

SOURCE = "source /opt/dtk/env.sh && "


@pytest.fixture(scope="module")
def dtk2404(rehearsal_builds: RehearsalBuilds) -> Built:
    return rehearsal_builds.get(DTK2404)


class Breaks:
    """Builds one broken copy of the staged context at a time; removes what it tagged."""

    def __init__(self, built: Built, engine: DockerEngine, root: Path) -> None:
        self.built, self.engine, self.root = built, engine, root
        self.tags: list[str] = []

    def context(self, name: str) -> Path:
        source = self.built.project / "build" / "context" / f"{DTK2404}-stable"
        folder = self.root / name
        # Wheels hard-linked: the staged ones, byte for byte (the cache holds). Every other
        # file copied, so a break written into one (a Dockerfile, a requirements file)
        # never reaches the staged context or another break.
        subprocess.run(["cp", "-al", str(source), str(folder)], check=True)
        for path in folder.rglob("*"):
            if path.is_file() and path.suffix != ".whl":
                data, mode = path.read_bytes(), path.stat().st_mode
                path.unlink()
                path.write_bytes(data)
                path.chmod(mode)
        return folder

    def build(self, folder: Path, name: str) -> str:
        """BuildKit on the broken context, offline, as `stackpin build --builder buildkit`."""
        tag = f"stackpin-test/rehearsal-break:{name}-{secrets.token_hex(4)}"
        self.tags.append(tag)
        cell = load_cell(Layout(self.built.project), DTK2404)
        self.engine.build(BuildRequest(
            context_dir=folder, tags=(tag,), network_mode="none", log_path=folder / "build.log",
            source_date_epoch=cell.source_date_epoch, builder="buildkit"))
        return tag

    def l0(self, image: str, *, bypass_entrypoint: bool = False) -> dict[str, dict[str, Any]]:
        """L0 in ``image`` as `verify --no-devices` runs it: the checks by name.
        ``bypass_entrypoint``: python started directly and the shell hooks cleared, what a
        hand-written `docker run --entrypoint python` (or an image without them) gives."""
        out = self.root / f"l0-{secrets.token_hex(4)}"
        out.mkdir()
        suite = ("-m", "stackpin_verify", "--levels", "0", "--out-dir", "/r")
        self.engine.run_to_completion(RunRequest(
            image=image,
            entrypoint=("python",) if bypass_entrypoint else None,
            command=suite if bypass_entrypoint else ("python", *suite),
            mounts=(BindMount(source=out, target="/r"),), network_mode="none",
            environment={"STACKPIN_NO_DEVICES": "1",
                         **({"BASH_ENV": "", "ENV": ""} if bypass_entrypoint else {})},
        ), timeout_s=900)
        report = json.loads((out / "report.json").read_text())
        return {c["name"]: c for c in report["checks"]}


@pytest.fixture(scope="module")
def breaks(dtk2404: Built, docker_engine: DockerEngine,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Breaks]:
    made = Breaks(dtk2404, docker_engine, tmp_path_factory.mktemp("breaks"))
    yield made
    for tag in made.tags:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)
    shutil.rmtree(made.root, ignore_errors=True)


def test_a_build_step_that_does_not_source_the_env_script_fails_the_guard(breaks: Breaks):
    folder = breaks.context("unsourced")
    text = (folder / "Dockerfile").read_text()
    guard = next(line for line in text.splitlines() if "/opt/stackpin/guard.py" in line)
    assert SOURCE in guard  # the classic path's RUN, or the one-stage path's step in its RUN
    (folder / "Dockerfile").write_text(text.replace(guard, guard.replace(SOURCE, "", 1)))
    with pytest.raises(BuildError) as failed:
        breaks.build(folder, "unsourced")
    log = (folder / "build.log").read_text(errors="replace")
    assert "stackpin guard: this build step did not source the env script" in log
    assert "/opt/dtk/env.sh was never sourced" in log
    assert "guard.py" in failed.value.message


def test_an_image_whose_shells_never_source_the_env_script_fails_l0_dtk_env(dtk2404: Built,
                                                                          breaks: Breaks):
    # The entrypoint bypassed and the shell hooks cleared: what a hand-written
    # `docker run --entrypoint python` or a Dockerfile without them would give.
    checks = breaks.l0(dtk2404.image("stable"), bypass_entrypoint=True)
    assert checks["L0.dtk_env"]["status"] == "fail"
    assert "/opt/dtk/env.sh was never sourced" in checks["L0.dtk_env"]["reason"]


def test_a_pypi_torch_in_the_vendor_layer_fails_the_guard_by_name(breaks: Breaks,
                                                                  dtk2404: Built):
    cpu = load_cells([ROOT / "pinning" / "cpu.toml"])[CPU_CELL].torch
    folder = breaks.context("pypi-torch")
    vendor = folder / "wheels" / "vendor"
    for wheel in vendor.glob("torch-*.whl"):
        wheel.unlink()
    # Where `rehearsal make` found the stand-in's content: the very index file.
    source = next((dtk2404.project / "wheels").glob(f"*/{cpu.filename}"), None) or (
        cache_dir() / "rehearsal-sources" / cpu.filename)
    shutil.copy2(source, vendor / cpu.filename)
    version = cpu.filename.split("-")[1]
    (vendor / "requirements.txt").write_text(
        f"torch=={version} --hash=sha256:{cpu.sha256}\n")
    with pytest.raises(BuildError):
        breaks.build(folder, "pypi-torch")
    log = (folder / "build.log").read_text(errors="replace")
    assert re.search(r"stackpin guard: torch is 2\.13\.0\+cpu, the cell pins "
                     r"2\.1\.0\+das\.opt2\.dtk24043", log), log[-3000:]
    assert "torch is 2.13.0+cpu, not the vendor's 2.1.0+das.opt2.dtk24043" in log


def test_a_dockerfile_that_sets_path_outright_fails_l0_path_naming_the_lost_tools(
        breaks: Breaks):
    folder = breaks.context("path-lost")
    text = (folder / "Dockerfile").read_text()
    extended = "PATH=/opt/stackpin/venv/bin:${PATH:-"
    assert extended in text
    fixed = "PATH=/opt/stackpin/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    broken = re.sub(r"    PATH=/opt/stackpin/venv/bin:\$\{PATH:-[^}]*\}", f"    {fixed}", text)
    assert broken != text
    (folder / "Dockerfile").write_text(broken)
    checks = breaks.l0(breaks.build(folder, "path-lost"))
    assert checks["L0.path"]["status"] == "fail"
    assert "/opt/hyhal/bin (hy-smi)" in checks["L0.path"]["reason"]
    # The env script still restores its own entries: only the base's check sees the loss.
    assert checks["L0.dtk_env"]["status"] == "pass"


def test_bundle_export_takes_a_rehearsal_image_only_when_its_cell_is_named(
        dtk2404: Built, tmp_path: Path):
    # The refusal is checked on every rehearsal image (test_rehearsal_images); here the one
    # way through, on the smallest: named, exported, and the manifest still says what it is.
    out = tmp_path / "bundle"
    done = stackpin_cli("bundle", "export", DTK2404, "-o", str(out), "--allow-rehearsal",
                        DTK2404, "--json", cwd=dtk2404.project)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    (image,) = manifest["images"]
    assert image["cell"] == DTK2404
    assert image["labels"]["io.stackpin.rehearsal"].startswith(
        "vendor rehearsal of dtk2404-torch210-py310")
    other = stackpin_cli("bundle", "export", DTK2404, "-o", str(tmp_path / "other"),
                         "--allow-rehearsal", "rehearsal-dtk2604-k100-torch290-py311",
                         cwd=dtk2404.project)
    assert other.returncode == 7 and not (tmp_path / "other").exists()
