"""``stackpin rehearsal``: the vendor rehearsal cells and their stand-in wheels."""

from __future__ import annotations

import click

from stackpin import rehearsal, rehearsal_make
from stackpin.cache import cache_dir
from stackpin.cli.common import all_cells, echo_json, json_option, project_layout
from stackpin.errors import ConfigurationError
from stackpin.matrix import Cell
from stackpin.matrixfile import find_cell


@click.group(name="rehearsal")
def command() -> None:
    """Rehearse DTK and ROCm cells without their vendor files (stand-ins, never shipped).

    \b
    Each DTK and ROCm cell has a rehearsal cell, derived from it (never written by hand):
    the same pins at the CPU base's CPython (3.11), a Debian base with a stand-in vendor
    tree, and vendor wheels under the vendor's names holding a CPU build, no kernels or
    metadata only. It locks, fetches, builds and verifies like any cell; its images are
    labelled io.stackpin.rehearsal and `bundle export` refuses them unless named with
    --allow-rehearsal. It proves the build path, not a DCU or AMD device.

    \b
    stackpin rehearsal list                 the rehearsal cells and what stands in
    stackpin rehearsal make CELL            its stand-in wheels into wheels/vendor/
    then, as for any cell: stackpin wheels fetch CELL; stackpin build CELL;
    stackpin verify CELL --levels 0 --no-devices
    """


def _cells() -> tuple[dict[str, Cell], dict[str, Cell]]:
    """The shipped cells and the rehearsal cells derived from them."""
    cells = all_cells()
    return cells, rehearsal.load_derived(project_layout().root, cells)


@command.command(name="list")
@json_option
def list_cmd(as_json: bool) -> None:
    """List every rehearsal cell: the cell it rehearses, its CPython, variants, stand-ins."""
    cells, derived = _cells()
    rows = []
    for cell in derived.values():
        assert cell.rehearsal is not None
        real = cells[cell.rehearsal.of]
        host = cells[rehearsal.HOST_CELL]
        standins = [{"filename": new.filename, "pinned": bool(new.sha256),
                     "kind": rehearsal.recipe(old, host).kind,
                     "holds": rehearsal.recipe(old, host).holds}
                    for old, new in rehearsal_make.vendor_pairs(real, cell)]
        rows.append({"id": cell.id, "of": cell.rehearsal.of, "python": cell.python,
                     "of_python": cell.rehearsal.of_python, "variants": list(cell.variants),
                     "standins": standins})
    if as_json:
        echo_json(rows)
        return
    for cell in derived.values():
        assert cell.rehearsal is not None
        click.echo(f"{cell.id:40} of {cell.rehearsal.of:30} {cell.python} "
                   f"(not {cell.rehearsal.of_python}) {','.join(cell.variants)}")


@command.command(name="make")
@click.argument("cell_id", metavar="CELL")
@json_option
def make_cmd(cell_id: str, as_json: bool) -> None:
    """Write CELL's stand-in wheels into wheels/vendor/ and pin their sha256.

    Sources are pinned index wheels (the CPU cell's torch, triton of the vendor's release),
    taken from the machine cache or a wheelhouse of this checkout, else downloaded. The
    same sources give the same bytes on every host; a changed pin (a new recipe) is
    written to pinning/rehearsal/standins.json and the cell must be locked again.
    """
    cells, derived = _cells()
    if not rehearsal.is_rehearsal_id(cell_id) and cell_id in cells:
        ids = [c.id for c in derived.values() if c.rehearsal and c.rehearsal.of == cell_id]
        hint = f"; its rehearsal cell is {ids[0]}" if ids else "; only DTK and ROCm cells rehearse"
        msg = f"'{cell_id}' is a real cell{hint}"
        raise ConfigurationError(msg)
    cell = find_cell(derived, cell_id)
    assert cell.rehearsal is not None
    root = project_layout().root
    made = rehearsal_make.make(
        cells[cell.rehearsal.of], cell, cells[rehearsal.HOST_CELL], root,
        cache=cache_dir() / "rehearsal-sources",
        on_line=lambda line: click.echo(line, err=True) if not as_json else None)
    changed = rehearsal_make.write_pins(root, made)
    if as_json:
        echo_json({"cell": cell.id, "changed": changed,
                   "standins": [m.__dict__ for m in made]})
        return
    for item in made:
        click.echo(f"stand-in: wheels/vendor/{item.filename} sha256 {item.sha256[:12]} "
                   f"({item.kind})")
    if changed:
        click.echo(f"pinned {len(changed)} new stand-in hash(es) in {rehearsal.PINS_PATH}: "
                   f"lock the cell again ('stackpin lock {cell.id}')")
