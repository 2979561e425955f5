"""Vendor rehearsal cells: derived from the real DTK and ROCm cells, marked, refused by export.

A site's real vendor files (the DTK torch, FlashAttention, triton, vLLM, the vendor base)
cannot reach this machine, so each DTK and ROCm cell has a rehearsal cell that goes
through the same build path with stand-ins (``stackpin.standin``, ``stackpin.vendortree``).
It is a pure function of the real cell (``derive``): everything is the real cell's except

- the CPython: the base's (Debian bookworm's 3.11, the CPU default cell's base), because no
  CPython 3.10 runtime installs offline from the index (issue 21: pbs-installer only lists
  GitHub URLs), so the vendor wheels' tags say cp311 and the index wheels are resolved for
  3.11 (its markers may add or drop a backport);
- the base: the CPU cell's Debian bootstrap plus Debian's lld, and the stand-in vendor tree;
- the vendor wheels' content (``recipe``) and so their sha256, which are pinned in
  ``pinning/rehearsal/standins.json`` by ``stackpin rehearsal make``.

Every image built from a rehearsal cell carries LABEL_REHEARSAL, its image.json says so
(reports, and so the grid, call its runs "vendor rehearsal"), and `bundle export` refuses
it unless the cell is named with --allow-rehearsal.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stackpin.abi import parse_wheel_filename
from stackpin.errors import ConfigurationError
from stackpin.lock import Lock, read_lock, stale_reason
from stackpin.matrix import Base, Cell, PinnedWheel
from stackpin.rehearsalspec import Rehearsal, describe
from stackpin.untrusted import parse_json, read_bounded
from stackpin.vendortree import DEBIAN_LLD_PACKAGE, TREES

PREFIX = "rehearsal-"
# The cell whose base (Debian bookworm, CPython 3.11) and CPU torch every rehearsal uses.
HOST_CELL = "cpu-bookworm-torch2130-py311"
PINS_PATH = Path("pinning") / "rehearsal" / "standins.json"
MAX_PINS_BYTES = 1 << 20

Kind = Literal["relabel", "no-kernels", "metadata"]


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How one vendor wheel's stand-in is made, and what it holds (one phrase)."""

    kind: Kind
    holds: str
    source: str = ""  # relabel: the index wheel whose content it carries
    source_sha256: str = ""
    version_module: str = ""  # relabel: the module whose __version__ gets the vendor's


# Index wheels whose content stands in for a vendor build of the same release, pinned. The
# triton of the DTK 26.04 cells is 3.5.0; PyPI's 3.5.0 holds the same HIP backend upstream.
INDEX_CONTENT: Mapping[tuple[str, str], tuple[str, str]] = {
    ("triton", "3.5.0"): (
        "triton-3.5.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        "f34bfa21c5b3a203c0f0eab28dcc1e49bd1f67d22724e77fb6665a659200a4ec",
    ),
}
# Packages L0 imports (stackpin.render's declared imports) that have no index content:
# they must import, and any kernel asked of them refuses.
NO_KERNELS = frozenset({"flash-attn"})


def recipe(wheel: PinnedWheel, host: Cell) -> Recipe:
    """The stand-in of one vendor wheel: the host's CPU torch for torch, a pinned index
    wheel of the same release, a package without kernels, or metadata only."""
    info = parse_wheel_filename(wheel.filename)
    if info.name == "torch":
        torch = parse_wheel_filename(host.torch.filename)
        return Recipe(kind="relabel", holds=f"torch {torch.version} from the index, CPU only",
                      source=host.torch.filename, source_sha256=host.torch.sha256,
                      version_module="torch/version.py")
    release = str(info.public_version)
    if (found := INDEX_CONTENT.get((info.name, release))) is not None:
        return Recipe(kind="relabel", holds=f"{info.name} {release} from the index",
                      source=found[0], source_sha256=found[1])
    if info.name in NO_KERNELS:
        return Recipe(kind="no-kernels", holds="imports, has no kernels")
    return Recipe(kind="metadata", holds="metadata only, no modules")


def rehearsal_id(real: Cell, host: Cell) -> str:
    """``dtk2604-k100-torch290-py310`` -> ``rehearsal-dtk2604-k100-torch290-py311``."""
    stem = re.sub(r"-py\d+$", "", real.id)
    return f"{PREFIX}{stem}-py{host.python.removeprefix('cp')}"


def standin_filename(filename: str, python: str) -> str:
    """The vendor file name at another CPython: its python (and matching abi) tag changed."""
    info = parse_wheel_filename(filename)
    abi = python if info.abi_tag == info.python_tag else info.abi_tag
    stem = filename[: -len(".whl")].rsplit("-", 3)[0]
    return f"{stem}-{python}-{abi}-{info.platform_tag}.whl"


def derive(real: Cell, *, host: Cell, pins: Mapping[str, str],
           locked: Mapping[str, str]) -> Cell:
    """The rehearsal cell of ``real``: the same cell at the host's CPython and base, its
    vendor wheels the stand-ins ``pins`` hashes (``stackpin rehearsal make``), its
    resolution constrained to ``locked``, the real lock's index versions."""
    if real.platform not in TREES:
        msg = f"cell '{real.id}' is a {real.platform} cell: only {', '.join(TREES)} cells rehearse"
        raise ConfigurationError(msg)
    spec = host.base.bootstrap
    if spec is None:
        msg = f"the rehearsal host cell '{host.id}' must bootstrap its base from Debian packages"
        raise ConfigurationError(msg)

    def pin(wheel: PinnedWheel) -> PinnedWheel:
        name = standin_filename(wheel.filename, host.python)
        return dataclasses.replace(wheel, filename=name, sha256=pins.get(name, ""),
                                   source="vendor")

    packages = tuple(sorted({*spec.packages, DEBIAN_LLD_PACKAGE}))
    marked = Rehearsal(of=real.id, of_python=real.python, content=content_line(real, host),
                       base_epoch=host.source_date_epoch, constraints=dict(sorted(locked.items())))
    return dataclasses.replace(
        real,
        id=rehearsal_id(real, host),
        description=describe(marked, python=host.python, platform=real.platform),
        python=host.python,
        glibc=host.glibc,
        base=Base(bootstrap=dataclasses.replace(spec, packages=packages)),
        torch=pin(real.torch),
        attention=pin(real.attention) if real.attention is not None else None,
        vendor_wheels=tuple(pin(w) for w in real.vendor_wheels),
        rehearsal=marked,
    )


def content_line(real: Cell, host: Cell) -> str:
    """What the stand-ins hold, per distribution, in one line."""
    wheels = [real.torch, *real.vendor_wheels, *([real.attention] if real.attention else [])]
    return "; ".join(f"{parse_wheel_filename(w.filename).name}: {recipe(w, host).holds}"
                     for w in wheels)


def stands_for(real_filename: str, holds: str) -> str:
    """The marker line of one stand-in wheel (and so of what an image installed). It names
    the vendor file, never the cell: two cells that pin one vendor file (K100 and BW pin
    one triton) get one stand-in, byte for byte, under its one name in wheels/vendor/."""
    return (f"stackpin vendor rehearsal stand-in for {real_filename}: {holds}; "
            "not the vendor's build")


def derived_cells(cells: Mapping[str, Cell], pins: Mapping[str, str],
                  locked: Mapping[str, Mapping[str, str]]) -> dict[str, Cell]:
    """The rehearsal cell of every DTK and ROCm cell, by id (none without the host cell);
    ``locked``: each real cell's locked index versions (``locked_versions``)."""
    host = cells.get(HOST_CELL)
    if host is None:
        return {}
    derived = (derive(cell, host=host, pins=pins, locked=locked.get(cell.id, {}))
               for cell in cells.values() if cell.platform in TREES and cell.rehearsal is None)
    return {cell.id: cell for cell in derived}


def locked_versions(lock: Lock | None) -> dict[str, str]:
    """A real cell's index wheels by name and version (empty without a lock)."""
    return {w.name: w.version for w in lock.wheels if w.source == "index"} if lock else {}


def load_derived(root: Path, cells: Mapping[str, Cell]) -> dict[str, Cell]:
    """The rehearsal cells of a checkout: pins and the real cells' locks read from it. A
    real cell whose lock is stale gives no rehearsal: its closure is not known."""
    locks = {}
    for cell in cells.values():
        lock = read_lock(root, cell.id) if cell.platform in TREES else None
        if lock is not None and stale_reason(lock, cell) is None:
            locks[cell.id] = locked_versions(lock)
    known = {cell_id: cell for cell_id, cell in cells.items()
             if cell.platform not in TREES or cell_id in locks}
    return derived_cells(known, read_pins(root), locks)


def is_rehearsal_id(cell_id: str) -> bool:
    return cell_id.startswith(PREFIX)


def read_pins(root: Path) -> dict[str, str]:
    """The stand-ins' sha256 by file name (pinning/rehearsal/standins.json), {} if none."""
    path = root / PINS_PATH
    if not path.exists():
        return {}
    data = parse_json(read_bounded(path, limit=MAX_PINS_BYTES, what="stand-in pins",
                                   error=ConfigurationError),
                      what=str(path), error=ConfigurationError)
    pins = data.get("standins") if isinstance(data, dict) else None
    if not isinstance(pins, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v)
            for k, v in pins.items()):
        msg = f"{path}: not stand-in pins (file name -> sha256); re-make them with " \
              "'stackpin rehearsal make CELL'"
        raise ConfigurationError(msg)
    return dict(pins)
