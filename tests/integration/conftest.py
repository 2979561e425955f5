"""Fixtures for the integration tier: a real daemon and the CPU default's base, once a session.

Without a daemon these tests skip with the reason, unless STACKPIN_REQUIRE_DOCKER=1 (set
by .ci/run), where a missing daemon is a failure: CI must not go green by skipping.

The engine matrix: tests that take ``matrix_engine`` (and ``matrix_base``) run once per
engine of STACKPIN_ENGINES, "NAME=DOCKER_HOST" words (.ci/run sets it from
`scripts/setup-engines.sh --print-hosts`: Docker 20.10, Docker 28 with the classic store,
Docker 28 with the containerd image store). Unset, they run on the default engine only;
under CI=true unset means the whole matrix, and an engine that does not answer fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import stackpin_cli
from tests.integration.leftovers import remove_test_images
from tests.integration.rehearsal_builds import RehearsalBuilds
from tests.integration.small_cell import small_checkout  # noqa: F401  (a session fixture)

from stackpin.bootstrap import BootstrapRequest, bootstrap_image, bootstrap_request
from stackpin.cache import cache_dir
from stackpin.engine import BindMount, RunRequest
from stackpin.engine.docker_api import DockerEngine
from stackpin.errors import StackpinError
from stackpin.matrix import Cell

ROOT = Path(__file__).resolve().parents[2]
CPU_CELL = "cpu-bookworm-torch2130-py311"
# Shared with `stackpin build` and with other checkouts on this host (a CI clone reuses
# the rootfs a developer's checkout bootstrapped for the base image the daemon holds).
CACHE_DIR = cache_dir()


def _unavailable(reason: str) -> None:
    if os.environ.get("STACKPIN_REQUIRE_DOCKER") == "1":
        pytest.fail(f"STACKPIN_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    try:
        engine = DockerEngine.connect()
    except StackpinError as exc:
        _unavailable(exc.message)
    with engine:
        # Before this session tags anything: what a killed run left (tests/integration/
        # leftovers.py says why the next run of that commit would fail on it).
        left = remove_test_images()
        if left:
            print(f"removed {len(left)} test images an earlier run left: {' '.join(left)}")
        yield engine


def matrix_hosts() -> list[tuple[str, str]]:
    """(name, DOCKER_HOST) of every engine the matrix tests run on."""
    words = os.environ.get("STACKPIN_ENGINES", "").split()
    if not words and os.environ.get("CI") == "true":
        words = subprocess.run(
            ["bash", str(ROOT / "scripts" / "setup-engines.sh"), "--print-hosts"],
            capture_output=True, text=True, check=True,
        ).stdout.split()
    if not words:
        words = [f"default={os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock')}"]
    return [(name, host) for name, _, host in (word.partition("=") for word in words)]


@pytest.fixture(scope="session", params=matrix_hosts(), ids=lambda pair: pair[0])
def matrix_engine(request: pytest.FixtureRequest) -> Iterator[DockerEngine]:
    """Each engine of the matrix in turn (see the module docstring)."""
    name, host = request.param
    try:
        engine = DockerEngine.connect(environ={**os.environ, "DOCKER_HOST": host})
    except StackpinError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but engine {name} is missing: {exc.message}", pytrace=False)
        _unavailable(exc.message)
    with engine:
        yield engine


@pytest.fixture(scope="session")
def matrix_base(
    matrix_engine: DockerEngine, cpu_bootstrap: BootstrapRequest, base_cache_dir: Path
) -> str:
    """The CPU default's bootstrapped base in the matrix engine (loaded at most once)."""
    return bootstrap_image(matrix_engine, cpu_bootstrap, cache_dir=base_cache_dir, on_line=print)


@pytest.fixture(scope="session")
def base_cache_dir() -> Path:
    return CACHE_DIR


@pytest.fixture(scope="session")
def cpu_bootstrap(shipped_cells: dict[str, Cell]) -> BootstrapRequest:
    return bootstrap_request(shipped_cells[CPU_CELL])


@pytest.fixture(scope="session")
def cpu_base(docker_engine: DockerEngine, cpu_bootstrap: BootstrapRequest, base_cache_dir: Path) -> str:
    """The CPU default's bootstrapped base image reference (built at most once)."""
    try:
        return bootstrap_image(
            docker_engine, cpu_bootstrap, cache_dir=base_cache_dir, on_line=print
        )
    except StackpinError as exc:
        _unavailable(exc.message)
        raise


@pytest.fixture(scope="session")
def tiny_models(cpu_image: dict[str, object], docker_engine: DockerEngine,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models/ folder holding ``tiny``: the seeded tiny chat model, written by the CPU
    image itself (stackpin_verify.tinychat), offline. Studio chats with and trains it."""
    folder = tmp_path_factory.mktemp("models")
    result = docker_engine.run_to_completion(RunRequest(
        image=str(cpu_image["image_id"]),
        command=("python", "-m", "stackpin_verify.tinychat", "model", "/out/tiny"),
        mounts=(BindMount(source=folder, target="/out"),),
        network_mode="none",
    ), timeout_s=900)
    assert result.exit_code == 0, result.logs[-3000:]
    assert (folder / "tiny" / "config.json").is_file()
    return folder


@pytest.fixture(scope="session")
def signed_cpu_bundle(cpu_image: dict[str, object], cpu_project: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The CPU image exported once a session as a signed bundle: (bundle folder, public key).

    Tests that load it elsewhere work in hard-linked copies (`cp -al`), so reports and
    state written beside a bundle never leak between tests.
    """
    work = tmp_path_factory.mktemp("bundle")
    done = stackpin_cli("keys", "generate", "-o", str(work / "keys"), cwd=cpu_project)
    assert done.returncode == 0, done.stderr
    done = stackpin_cli("bundle", "export", CPU_CELL, "-o", str(work / "site"),
                        "--sign-key", str(work / "keys" / "stackpin.key"), "--json",
                        cwd=cpu_project)
    assert done.returncode == 0, done.stderr
    return work / "site", work / "keys" / "stackpin.pub"


@pytest.fixture(scope="session")
def rehearsal_builds(docker_engine: DockerEngine, cpu_project: Path,
                     request: pytest.FixtureRequest) -> Iterator[RehearsalBuilds]:
    """The vendor rehearsal's images, each built the first time a test asks for it (in the
    session's checkout copy), removed when its module is done; the cost of each step is
    printed at the end (docs/benchmarks.md quotes it)."""
    builds = RehearsalBuilds(cpu_project)
    yield builds
    for cell in list(builds.built):
        builds.drop(cell)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for cell, costs in builds.costs.items():
        line = f"rehearsal cost {cell}: {json.dumps(costs, sort_keys=True)}"
        if reporter is not None:
            reporter.write_line(line)
