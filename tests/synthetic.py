"""Synthetic cells and their locks (tests/fixtures/synthetic.toml): inputs for goldens.

Their pins are made up, so no golden file moves when a shipped matrix bumps a pin. The
lock of a synthetic cell is built by stackpin's own lock code from a made-up wheelhouse
listing (one file per pin, sha256 of its name), so it is as real as a fetched one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from stackpin.lock import Lock, build_lock
from stackpin.matrix import Cell, load_cells

SYNTHETIC_MATRIX = Path(__file__).resolve().parent / "fixtures" / "synthetic.toml"


def synthetic_cells() -> dict[str, Cell]:
    return load_cells([SYNTHETIC_MATRIX])


def synthetic_listing(cell: Cell) -> dict[str, str]:
    """The wheelhouse a fetch would give: every pinned file, one wheel per stack pin."""
    listing = {w.filename: w.sha256 for w in (cell.torch, *cell.vendor_wheels)}
    if cell.attention is not None:
        listing[cell.attention.filename] = cell.attention.sha256
    for dist, version in cell.stack.items():
        name = f"{dist}-{version}-py3-none-any.whl"
        listing[name] = hashlib.sha256(name.encode()).hexdigest()
    return listing


def synthetic_lock(cell: Cell) -> Lock:
    return build_lock(cell, synthetic_listing(cell), base_reference="synthetic-base")
