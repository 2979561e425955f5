"""Shared fixtures: the repository root and its shipped cells."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stackpin.matrix import Cell, load_cells

ROOT = Path(__file__).resolve().parents[1]
CPU_CELL = "cpu-bookworm-torch2130-py311"
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


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shipped_cells() -> dict[str, Cell]:
    return load_cells(sorted((ROOT / "pinning").glob("*.toml")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Integration tests against the real daemon run last (tox's rule: cheap feedback first).
    items.sort(key=lambda item: item.get_closest_marker("docker") is not None)


def _stackpin(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stackpin.cli.main", *args],
        cwd=cwd, capture_output=True, text=True, check=False,
    )


@pytest.fixture(scope="session")
def cpu_image(docker_engine) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The CPU default image, built through the real CLI (fetch + build) when missing.

    Returns the build record (image_id, tags, sizes). A warm build reuses every layer,
    so running the suite after `scripts/demo.sh` costs seconds.
    """
    for args in (("wheels", "fetch", CPU_CELL), ("build", CPU_CELL)):
        if args[0] == "wheels" and not _stackpin("wheels", "verify", CPU_CELL).returncode:
            continue
        done = _stackpin(*args)
        assert done.returncode == 0, f"stackpin {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    record = json.loads((ROOT / "build" / "records" / f"{CPU_CELL}-stable.json").read_text())
    return dict(record)
