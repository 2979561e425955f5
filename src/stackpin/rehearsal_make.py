"""Make a rehearsal cell's stand-in wheels (side effects: downloads, wheels/vendor/, pins).

The stand-ins go where a site drops its vendor files, ``wheels/vendor/``, under the vendor's
file names at the rehearsal's CPython (``-cp311-cp311-``, so never a real vendor file's
name), and from there through the same lock, fetch and build as a real cell's. Their
sha256 are pinned in ``pinning/rehearsal/standins.json``: the same pinned sources give the
same bytes (``stackpin.standin``), so on a host that made them before nothing changes.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from stackpin import rehearsal
from stackpin.abi import parse_wheel_filename
from stackpin.boundary import effective_provided
from stackpin.errors import HostEnvironmentError
from stackpin.lock import write_text_atomic
from stackpin.matrix import Cell, PinnedWheel
from stackpin.piptarget import LineSink, Runner, subprocess_runner
from stackpin.primitives import pretty_json, sha256_file
from stackpin.standin import StandIn, made_wheel, no_kernel_module, relabel_wheel
from stackpin.wheelhouse import pip_download_argv, vendor_dir


@dataclass(frozen=True, kw_only=True)
class Made:
    """One stand-in written to wheels/vendor/."""

    filename: str
    sha256: str
    kind: str
    stands_for: str


def _ignore(_line: str) -> None:
    """Default progress sink."""


def vendor_pairs(real: Cell, derived: Cell) -> list[tuple[PinnedWheel, PinnedWheel]]:
    """Each real vendor pin with the rehearsal's pin of the same wheel (same order)."""
    def wheels(cell: Cell) -> list[PinnedWheel]:
        return [cell.torch, *cell.vendor_wheels, *([cell.attention] if cell.attention else [])]

    return list(zip(wheels(real), wheels(derived), strict=True))


def make(real: Cell, derived: Cell, host: Cell, root: Path, *, cache: Path,
         runner: Runner = subprocess_runner, on_line: LineSink = _ignore) -> list[Made]:
    """Write every stand-in of ``derived`` into wheels/vendor/; return what was made."""
    provided = effective_provided(real)
    out_dir = vendor_dir(root)
    made = []
    for real_wheel, wheel in vendor_pairs(real, derived):
        info = parse_wheel_filename(wheel.filename)
        recipe = rehearsal.recipe(real_wheel, host)
        entry = provided.get(info.name)
        stand_in = StandIn(
            filename=wheel.filename,
            stands_for=rehearsal.stands_for(real_wheel.filename, recipe.holds),
            requires=entry.requires if entry is not None else (),
            version_module=recipe.version_module,
        )
        if recipe.kind == "relabel":
            source = source_wheel(recipe.source, recipe.source_sha256, cell=derived, root=root,
                                  cache=cache, runner=runner, on_line=on_line)
            path = relabel_wheel(source, stand_in, out_dir)
        elif recipe.kind == "no-kernels":
            module = info.dist.replace("-", "_")
            path = made_wheel(stand_in, out_dir, modules=no_kernel_module(
                module, version=str(info.public_version), stands_for=stand_in.stands_for))
        else:
            path = made_wheel(stand_in, out_dir)
        made.append(Made(filename=path.name, sha256=sha256_file(path), kind=recipe.kind,
                         stands_for=stand_in.stands_for))
        on_line(f"rehearsal: {path.name} ({recipe.kind}: {recipe.holds})")
    return made


def source_wheel(filename: str, sha256: str, *, cell: Cell, root: Path, cache: Path,
                 runner: Runner = subprocess_runner, on_line: LineSink = _ignore) -> Path:
    """The pinned index wheel a stand-in is made from: from the machine cache, from a
    wheelhouse of this checkout (the CPU cell's holds its torch), else downloaded, each
    checked against ``sha256``."""
    places = [cache / filename, *sorted((root / "wheels").glob(f"*/{filename}"))]
    for place in places:
        if place.is_file() and sha256_file(place) == sha256:
            return place
    cache.mkdir(parents=True, exist_ok=True)
    name, version = parse_wheel_filename(filename).name, parse_wheel_filename(filename).version
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{name}=={version} --hash=sha256:{sha256}\n", encoding="utf-8")
        on_line(f"rehearsal: downloading {filename}")
        argv = pip_download_argv(cell, dest=Path(tmp), requirements=requirements)
        if runner(argv, on_line) != 0 or not (Path(tmp) / filename).is_file():
            msg = (f"could not download {filename} (sha256 {sha256[:12]}), the content of a "
                   "rehearsal stand-in: check the index answers and still serves that file")
            raise HostEnvironmentError(msg)
        (Path(tmp) / filename).replace(cache / filename)
    return cache / filename


def write_pins(root: Path, made: list[Made]) -> list[str]:
    """Pin the stand-ins' sha256 (merged with the others'); the file names whose pin changed."""
    pins = rehearsal.read_pins(root)
    changed = [m.filename for m in made if pins.get(m.filename) != m.sha256]
    if changed:
        pins.update({m.filename: m.sha256 for m in made})
        write_text_atomic(root / rehearsal.PINS_PATH,
                          pretty_json({"schema": 1, "standins": dict(sorted(pins.items()))}))
    return changed
