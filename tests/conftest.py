"""Shared fixtures: the repository root and its shipped cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackpin.matrix import Cell, load_cells

ROOT = Path(__file__).resolve().parents[1]
CPU_CELL = "cpu-bookworm-torch2130-py311"
K100_CELL = "dtk2604-k100-torch290-py310"


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shipped_cells() -> dict[str, Cell]:
    return load_cells(sorted((ROOT / "pinning").glob("*.toml")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Integration tests against the real daemon run last (tox's rule: cheap feedback first).
    items.sort(key=lambda item: item.get_closest_marker("docker") is not None)
