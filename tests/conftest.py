"""Shared fixtures: the repository root and its shipped cells."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stackpin.matrix import Cell
from stackpin.matrixfile import load_cells

ROOT = Path(__file__).resolve().parents[1]
CPU_CELL = "cpu-bookworm-torch2130-py311"
CUDA_CELL = "cuda130-sm90-torch2110-py311"
K100_CELL = "dtk2604-k100-torch290-py310"


@pytest.fixture(autouse=True)
def _no_site_trust(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
                   ) -> None:
    """No test trusts a key by accident: the host's trust file and variables are ignored."""
    from stackpin.bundle import trust

    monkeypatch.setattr(trust, "SITE_TRUST_FILE",
                        tmp_path_factory.getbasetemp() / "no-site-trust" / "trusted.pub")
    monkeypatch.delenv(trust.PUBKEY_ENV, raising=False)
    monkeypatch.delenv(trust.INSECURE_ENV, raising=False)


@pytest.fixture
def engine_seam(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Any]:
    """Put an engine (the shared fake) where every verb reaches its engine: install(engine)."""
    from stackpin.cli import common

    def install(engine: Any) -> Any:
        monkeypatch.setattr(common.ENGINE, "factory", lambda: contextlib.nullcontext(engine))
        return engine

    return install


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shipped_cells() -> dict[str, Cell]:
    return load_cells(sorted((ROOT / "pinning").glob("*.toml")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Integration tests against the real daemon run last (tox's rule: cheap feedback first).
    items.sort(key=lambda item: item.get_closest_marker("docker") is not None)
    workerinput = getattr(config, "workerinput", None)  # set on an xdist worker
    spread_slow_tests(items, int(workerinput["workercount"]) if workerinput else 1)


def spread_slow_tests(items: list[pytest.Item], workers: int) -> None:
    """Put the daemon-free tests marked slow at the heads of the workers' shares, in turn.

    xdist's worksteal (scripts/test.sh) gives each worker one contiguous share of the queue;
    the two index resolutions (2 min each on a slow link), side by side in collection order,
    ran back to back on one worker and were the tier's critical path."""
    tier = [item for item in items if item.get_closest_marker("docker") is None]
    slow = [item for item in tier if item.get_closest_marker("slow")]
    if workers < 2 or not slow:
        return
    rest = [item for item in tier if not item.get_closest_marker("slow")]
    size = -(-len(tier) // workers)
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for n, item in enumerate(slow):
        shares[n % workers].append(item)
    for n, share in enumerate(shares):
        take = len(rest) if n == workers - 1 else max(size - len(share), 0)
        share.extend(rest[:take])
        rest = rest[take:]
    items[:len(tier)] = [item for share in shares for item in share]


def checkout_copy(dest: Path, *, wheels_from: Path = ROOT) -> Path:
    """A copy of the checkout as a user would have it: tracked and untracked files, .git,
    and the (ignored) wheelhouse hard-linked from ``wheels_from``; no .venv, no build/.
    Integration tests run the CLI there, so nothing they do (fetch, lock, build records)
    writes into ROOT. On a fresh clone only the session's ``cpu_project`` has fetched the
    wheelhouse, so copies made after it take their wheels from there."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = ROOT / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    if (ROOT / ".git").is_dir():
        shutil.copytree(ROOT / ".git", dest / ".git", symlinks=True)
    else:  # a `git worktree` checkout: .git is a file naming the shared git dir
        shutil.copy2(ROOT / ".git", dest / ".git")
    for folder in (f"wheels/{CPU_CELL}", "wheels/vendor", "wheels/tools"):
        if (wheels_from / folder).is_dir():
            shutil.copytree(wheels_from / folder, dest / folder, copy_function=_link_new,
                            dirs_exist_ok=True)
    return dest


def _link_new(source: str, target: str) -> None:
    if not os.path.exists(target):  # tracked files (wheels/vendor/README.md) are copied
        os.link(source, target)


def stackpin_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stackpin.cli.main", *args],
        cwd=cwd, capture_output=True, text=True, check=False,
    )


@pytest.fixture(scope="session")
def cpu_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's copy of the checkout where the CPU default is fetched and built."""
    return checkout_copy(tmp_path_factory.mktemp("checkout"))


@pytest.fixture(scope="session")
def cpu_image(docker_engine, cpu_project: Path) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The CPU default image, built through the real CLI (fetch + build) in ``cpu_project``.

    Returns the build record (image_id, tags, sizes). A warm build reuses every layer,
    so running the suite after `scripts/demo.sh` costs seconds. A fetch, when the
    wheelhouse does not match the lock, rewrites the copy's lock, never the checkout's.
    """
    for args in (("wheels", "fetch", CPU_CELL), ("build", CPU_CELL)):
        if args[0] == "wheels" and not stackpin_cli("wheels", "verify", CPU_CELL,
                                                    cwd=cpu_project).returncode:
            continue
        done = stackpin_cli(*args, cwd=cpu_project)
        assert done.returncode == 0, f"stackpin {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    record = json.loads((cpu_project / "build" / "records" / f"{CPU_CELL}-stable.json").read_text())
    return dict(record)


def pin_fake_installer(root: Path, data: bytes = b"the pinned installer wheel") -> None:
    """pinning/tools/installer.toml in ``root`` naming the shipped uv wheel's file name with
    the sha256 of ``data``, and that file in wheels/tools/: a project whose build passes the
    installer checks without the real 17 MB wheel (unit tests never run it)."""
    from stackpin import tools

    pinned = tools.load_installer(ROOT)
    (root / tools.PIN).parent.mkdir(parents=True, exist_ok=True)
    (root / tools.PIN).write_text((ROOT / tools.PIN).read_text(encoding="utf-8").replace(
        pinned.sha256, hashlib.sha256(data).hexdigest()), encoding="utf-8")
    (root / tools.TOOLS_DIR).mkdir(parents=True, exist_ok=True)
    (root / tools.TOOLS_DIR / pinned.wheel).write_bytes(data)


# Each test over SLOW_TEST_S is named as it ends, with the session's clock: a run cut short
# (CI's 90 minutes) still says where its time went; --durations prints only at the end.
SLOW_TEST_S = 20.0
_test_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    seconds = _test_seconds.get(report.nodeid, 0.0) + report.duration
    _test_seconds[report.nodeid] = seconds
    if report.when != "teardown":
        return
    del _test_seconds[report.nodeid]
    if seconds < SLOW_TEST_S:
        return
    config = _CONFIG[0] if _CONFIG else None
    reporter = config.pluginmanager.get_plugin("terminalreporter") if config else None
    if reporter is not None and config is not None:
        elapsed = time.monotonic() - config.stash[_SESSION_START]
        reporter.write("\n")
        reporter.write_line(f"[slow] {seconds:.0f} s {report.nodeid} (session +{elapsed:.0f} s)")


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG[:] = [config]
    config.stash[_SESSION_START] = time.monotonic()


_CONFIG: list[pytest.Config] = []
_SESSION_START = pytest.StashKey[float]()
