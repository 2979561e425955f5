"""``stackpin lock``: resolve a cell with pip's resolver and write its lock."""

from __future__ import annotations

import click

from stackpin.checks import require_resolvable
from stackpin.cli.common import cell_argument, echo_json, json_option, project_layout
from stackpin.lock import lock_from_resolution, lock_path, write_text_atomic
from stackpin.render import base_reference
from stackpin.resolve import Pip, resolve_cell
from stackpin.target import load_cell


@click.command(name="lock")
@cell_argument
@click.option("--refresh", is_flag=True, help="Resolve again instead of using the cache.")
@json_option
def command(cell_id: str, refresh: bool, as_json: bool) -> None:
    """Resolve CELL's closure (pip, vendor boundary respected) into pinning/locks/CELL.lock.

    Every distribution is recorded with its version, file, sha256 and origin (index URL,
    vendor file, base image); excluded distributions and dropped requirements are recorded
    too. The lock's own sha256 becomes the image tag and label. Nothing is written when the
    cell does not resolve: each conflict is one line (exit 4).
    """
    layout = project_layout()
    root = layout.root
    cell = load_cell(layout, cell_id)
    require_resolvable(cell)
    resolution = resolve_cell(cell, Pip(), use_cache=not refresh)
    lock = lock_from_resolution(cell, resolution, base_reference=base_reference(cell),
                                base_digest=cell.base.digest)
    path = lock_path(root, cell.id)
    write_text_atomic(path, lock.text())
    if as_json:
        echo_json({"cell": cell.id, "lock": str(path), "digest": lock.digest,
                   "wheels": len(lock.wheels), "complete": lock.complete})
        return
    click.echo(f"locked {cell.id}: {len(lock.wheels)} distributions, digest {lock.digest[:12]} "
               f"-> {path}")
    for name in lock.missing:
        click.echo(f"  vendor file to pin: {name}")
