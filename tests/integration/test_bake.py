"""The generated bake file is real: `docker buildx bake` builds a cell's target from it.

What a user of `stackpin ci matrix --format bake` does (its help says so): stage the contexts
with `stackpin build --prepare-only`, write docker-bake.hcl, run `docker buildx bake`. On the
first engine of the matrix whose own builder is BuildKit (Docker 28, classic store, in CI;
the default engine when the matrix is not set up), with the daemon's BuildKit (buildx's
docker driver: the base comes from the local store). The result must be the cell's image:
its tags and labels, SOURCE_DATE_EPOCH applied to the config, built offline from the
wheelhouse (network "none" in the file), and it runs through its entrypoint.

The cell is the engine matrix's small one (the CPU default renamed, a small template): the
bake file, not torch, is under test, and the CPU image's cold build here cost 123 s of
CI's 90 minutes (the full image is built by test_build_cpu and the matrix's engines).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import stackpin_cli
from tests.integration.conftest import matrix_hosts
from tests.integration.small_cell import MATRIX_CELL
from tests.tools import need_docker_plugin

from stackpin.bootstrap import BootstrapRequest, bootstrap_image
from stackpin.engine import RunRequest
from stackpin.engine.docker_api import DockerEngine
from stackpin.lock import read_lock

pytestmark = pytest.mark.docker

TARGET = f"{MATRIX_CELL}-stable"


def bake_host() -> str:
    hosts = dict(matrix_hosts())
    return hosts.get("docker28-classic") or next(iter(hosts.values()))


@pytest.fixture(scope="module")
def bake_engine(cpu_bootstrap: BootstrapRequest, base_cache_dir: Path) -> Iterator[DockerEngine]:
    with DockerEngine.connect(environ={**os.environ, "DOCKER_HOST": bake_host()}) as engine:
        bootstrap_image(engine, cpu_bootstrap, cache_dir=base_cache_dir, on_line=print)
        yield engine


def test_buildx_bakes_the_cell_from_the_generated_file(bake_engine, small_checkout: Path,
                                                      tmp_path: Path):
    docker = need_docker_plugin("buildx")
    checkout = tmp_path / "checkout"  # hard links: the staged contexts land in this copy
    subprocess.run(["cp", "-al", str(small_checkout), str(checkout)], check=True)
    for args in (("build", MATRIX_CELL, "--variant", "stable", "--prepare-only"),
                 ("ci", "matrix", "--format", "bake", "--select", MATRIX_CELL)):
        done = stackpin_cli(*args, cwd=checkout)
        assert done.returncode == 0, done.stderr
    (checkout / "docker-bake.hcl").write_text(done.stdout)
    lock = read_lock(checkout, MATRIX_CELL)
    assert lock is not None
    tag = f"stackpin/{MATRIX_CELL}:stable-{lock.digest[:12]}"
    bake_engine.remove_image(tag)  # what is there after the bake is the bake's

    baked = subprocess.run(
        [docker, "buildx", "bake", "--builder", "default", "--progress", "plain", "-f",
         "docker-bake.hcl", TARGET],
        cwd=checkout, env={**os.environ, "DOCKER_HOST": bake_engine.url},
        capture_output=True, text=True, check=False, timeout=3600,
    )
    try:
        assert baked.returncode == 0, baked.stderr[-4000:]
        assert "load local bake definitions" in baked.stderr  # buildx bake read the file
        info = bake_engine.image_info(tag)
        assert info is not None, f"bake did not leave {tag} on {bake_engine.url}"
        assert info.labels["io.stackpin.lock-digest"] == lock.digest
        assert info.labels["io.stackpin.variant"] == "stable"
        assert info.labels["io.stackpin.cell"] == MATRIX_CELL
        if bake_engine.version().version.split(".")[0] != "20":
            assert info.created == "2025-01-01T00:00:00Z"  # the file's SOURCE_DATE_EPOCH
        ran = bake_engine.run_to_completion(RunRequest(image=tag, network_mode="none"),
                                            timeout_s=600)
        assert (ran.exit_code, ran.stdout.strip()) == (0, MATRIX_CELL), ran.logs
    finally:
        bake_engine.remove_image(tag, force=True)
        bake_engine.remove_image(f"stackpin/{MATRIX_CELL}:stable", force=True)
