"""``stackpin lock``: resolve a cell with pip's resolver and write its lock."""

from __future__ import annotations

import click

from stackpin.checks import require_resolvable
from stackpin.cli.common import cell_argument, echo_json, json_option, project_layout
from stackpin.lock import (
    changed_pins,
    lock_from_resolution,
    lock_path,
    read_lock,
    resolve_keeping,
    write_text_atomic,
)
from stackpin.render import base_reference
from stackpin.resolve import Pip
from stackpin.target import load_cell


@click.command(name="lock")
@cell_argument
@click.option("--refresh", is_flag=True, help="Resolve again instead of using the cache.")
@click.option("--upgrade", is_flag=True,
              help="Take the newest version the pins allow of every distribution the cell "
                   "does not pin, instead of keeping the current lock's.")
@json_option
def command(cell_id: str, refresh: bool, upgrade: bool, as_json: bool) -> None:
    """Resolve CELL's closure (pip, vendor boundary respected) into pinning/locks/CELL.lock.

    Every distribution is recorded with its version, file, sha256 and origin (index URL,
    vendor file, base image); excluded distributions and dropped requirements are recorded
    too. The lock's own sha256 becomes the image tag and label. Nothing is written when the
    cell does not resolve: each conflict is one line (exit 4).

    A lock already there is kept where it can be: every distribution the cell does not pin
    keeps its locked version unless the new pins need another (then the whole closure is
    resolved afresh, and said). So changing one pin changes that pin and what it needs, and
    the image's other layers keep their digests. --upgrade resolves afresh. Every version
    that moved is listed.
    """
    layout = project_layout()
    root = layout.root
    cell = load_cell(layout, cell_id)
    require_resolvable(cell)
    current = read_lock(root, cell.id)  # a malformed one stops here, before pip runs
    previous = None if upgrade else current
    resolution, held = resolve_keeping(cell, Pip(), previous, use_cache=not refresh)
    lock = lock_from_resolution(cell, resolution, base_reference=base_reference(cell),
                                base_digest=cell.base.digest)
    path = lock_path(root, cell.id)
    changed = changed_pins(current, lock)
    write_text_atomic(path, lock.text())
    how = ("kept the current lock's versions" if held else
           "resolved afresh" + (" (the pins need versions the current lock does not hold)"
                                if previous else ""))
    if as_json:
        echo_json({"cell": cell.id, "lock": str(path), "digest": lock.digest,
                   "wheels": len(lock.wheels), "complete": lock.complete,
                   "kept": held, "changed": changed})
        return
    click.echo(f"locked {cell.id}: {len(lock.wheels)} distributions, digest {lock.digest[:12]} "
               f"-> {path}; {how}")
    for line in changed:
        click.echo(f"  {line}")
    for name in lock.missing:
        click.echo(f"  vendor file to pin: {name}")
