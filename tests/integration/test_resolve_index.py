"""Real resolutions against the package index with pip's own resolver (CI reaches PyPI).

Not mocked and never skipped: the CPU default cell and the K100 DTK cell (vendor torch,
triton and FlashAttention as placeholders) resolve, and the DTK closure takes nothing
from the index that the vendor boundary excludes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, K100_CELL

from stackpin.lock import lock_from_resolution
from stackpin.matrix import Cell
from stackpin.resolve import Pip, resolve_cell

pytestmark = [pytest.mark.index, pytest.mark.slow]
NEVER_FROM_THE_INDEX_ON_DTK = {"bitsandbytes", "xformers", "torchvision", "triton", "torch"}


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKPIN_CACHE_DIR", str(tmp_path / "cache"))


def test_cpu_cell_resolves_and_locks(shipped_cells: dict[str, Cell]):
    cell = shipped_cells[CPU_CELL]
    result = resolve_cell(cell, Pip(), use_cache=False)
    assert result.ok, [str(c) for c in result.conflicts]
    lock = lock_from_resolution(cell, result, base_reference="x")
    pins = lock.pins()
    assert pins["torch"] == "2.13.0+cpu"
    for dist, version in cell.stack.items():
        assert pins[dist] == version
    assert all(w.sha256 and w.origin for w in lock.installed())


def test_k100_cell_resolves_inside_the_vendor_boundary(shipped_cells: dict[str, Cell]):
    cell = shipped_cells[K100_CELL]
    result = resolve_cell(cell, Pip(), use_cache=False)
    assert result.ok, [str(c) for c in result.conflicts]
    from_index = {r.name for r in result.closure if r.origin == "index"}
    assert not from_index & NEVER_FROM_THE_INDEX_ON_DTK
    vendor = {r.name: r.version for r in result.closure if r.origin == "vendor-wheel"}
    assert vendor["torch"] == "2.9.0+das.opt1.dtk2604"
    assert {"unsloth", "unsloth-zoo", "transformers", "sympy"} <= from_index


def test_k100_transformers_pin_outside_unsloths_range_fails(shipped_cells: dict[str, Cell]):
    cell = shipped_cells[K100_CELL]
    # unsloth 2026.10.9 (and unsloth_zoo) exclude transformers 4.57.4 by name.
    moved = dataclasses.replace(cell, stack={**cell.stack, "transformers": "4.57.4"})
    result = resolve_cell(moved, Pip(), use_cache=False)
    lines = [str(c) for c in result.conflicts]
    assert any(line.startswith((f"{K100_CELL}: unsloth 2026.10.9 requires transformers",
                                f"{K100_CELL}: unsloth-zoo 2026.10.9 requires transformers"))
               and line.endswith("; the cell pins 4.57.4") for line in lines), lines
