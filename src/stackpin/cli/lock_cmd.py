"""``stackpin lock``: (re)write a cell's lock from its wheelhouse."""

from __future__ import annotations

import click

from stackpin.cli.common import cell_argument, echo_json, json_option, project_layout
from stackpin.lock import build_lock, lock_path, write_text_atomic
from stackpin.render import base_reference
from stackpin.target import load_cell
from stackpin.wheelhouse import scan


@click.command(name="lock")
@cell_argument
@json_option
def command(cell_id: str, as_json: bool) -> None:
    """Write pinning/locks/CELL.lock from the wheels in wheels/CELL/ and wheels/vendor/.

    Every wheel the image installs is recorded (name, version, filename, sha256, layer)
    with the base reference; the lock's own sha256 becomes the image tag and label.
    'stackpin wheels fetch' does this after downloading; run it by hand after dropping
    vendor wheels in. Nothing is written when the wheelhouse does not fit the cell.
    """
    layout = project_layout()
    root = layout.root
    cell = load_cell(layout, cell_id)
    lock = build_lock(cell, scan(cell, root), base_reference=base_reference(cell))
    path = lock_path(root, cell.id)
    write_text_atomic(path, lock.text())
    if as_json:
        echo_json({"cell": cell.id, "lock": str(path), "digest": lock.digest,
                   "wheels": len(lock.wheels), "complete": lock.complete})
        return
    click.echo(f"locked {cell.id}: {len(lock.wheels)} wheels, digest {lock.digest[:12]} -> {path}")
