"""Synthetic cells and their locks (tests/fixtures/synthetic.toml): inputs for goldens.

Their pins are made up, so no golden file moves when a shipped matrix bumps a pin. The
lock of a synthetic cell is built by stackpin's own lock code from a made-up wheelhouse
listing (one file per pin, sha256 of its name), so it is as real as a fetched one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from stackpin.boundary import effective_provided
from stackpin.lock import Lock, lock_from_resolution
from stackpin.matrix import Cell
from stackpin.matrixfile import load_cells
from stackpin.resolve import Resolution, Resolved, index_pins

SYNTHETIC_MATRIX = Path(__file__).resolve().parent / "fixtures" / "synthetic.toml"


def synthetic_cells() -> dict[str, Cell]:
    return load_cells([SYNTHETIC_MATRIX])


def synthetic_resolution(cell: Cell) -> Resolution:
    """What a resolution would give: the vendor files provided, every other pin indexed."""
    closure = [Resolved(name=name, version=p.version, origin="vendor-wheel")
               for name, p in effective_provided(cell).items()]
    pinned = {**index_pins(cell), **cell.stack}
    files = {w.filename.split("-")[0].lower().replace("_", "-"): w
             for w in (cell.torch, *cell.vendor_wheels) if w.source == "index"}
    for dist, version in sorted(pinned.items()):
        wheel = files.get(dist)
        # numpy is the one wheel with compiled code, as on the index: the stack's layers
        # (stackpin.layers) then show both halves, the compiled one and the pinned one.
        tags = (f"{cell.python}-{cell.python}-manylinux_2_17_x86_64" if dist == "numpy"
                else "py3-none-any")
        # A wheel's file name spells the distribution with underscores (the wheel spec).
        name = wheel.filename if wheel else f"{dist.replace('-', '_')}-{version}-{tags}.whl"
        sha = wheel.sha256 if wheel else hashlib.sha256(name.encode()).hexdigest()
        closure.append(Resolved(name=dist, version=version, origin="index", filename=name,
                                url=f"https://files.example.invalid/{name}", sha256=sha))
    return Resolution(cell=cell.id, key="synthetic", closure=tuple(closure))


def synthetic_lock(cell: Cell) -> Lock:
    return lock_from_resolution(cell, synthetic_resolution(cell),
                                base_reference="synthetic-base")
