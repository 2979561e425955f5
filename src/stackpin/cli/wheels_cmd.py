"""``stackpin wheels``: fill and verify the offline wheelhouse."""

from __future__ import annotations

import click

from stackpin.cli.common import cell_argument, echo_json, json_option, project_layout
from stackpin.errors import ValidationError
from stackpin.lock import lock_path, write_text_atomic
from stackpin.render import base_reference
from stackpin.target import current_lock, load_cell
from stackpin.wheelhouse import fetch, verify_wheelhouse


@click.group(name="wheels")
def command() -> None:
    """Fetch wheels for a cell's target on a connected host; verify them offline."""


@command.command(name="fetch")
@cell_argument
@click.option("-v", "--verbose", is_flag=True, help="Show pip's output as it runs.")
@json_option
def fetch_cmd(cell_id: str, verbose: bool, as_json: bool) -> None:
    """Download binary wheels for CELL's CPython/ABI/platform into wheels/CELL/.

    With a current lock the download is exact and hash-checked; otherwise pip resolves
    the stack once and the result is written as the new lock. Vendor wheels (DTK torch,
    DTK FlashAttention) are not downloadable: drop them into wheels/vendor/ first.
    """
    layout = project_layout()
    root = layout.root
    cell = load_cell(layout, cell_id)

    def show(line: str) -> None:
        if verbose:
            click.echo(f"  {line}", err=True)

    result = fetch(cell, root, base_reference=base_reference(cell), on_line=show)
    path = lock_path(root, cell.id)
    write_text_atomic(path, result.lock.text())
    if as_json:
        echo_json({"cell": cell.id, "mode": result.mode, "wheels": result.wheel_count,
                   "bytes": result.bytes, "lock": str(path), "digest": result.lock.digest})
        return
    click.echo(
        f"wheels: {result.wheel_count} wheels ({result.bytes / 2**20:.0f} MiB, {result.mode}) "
        f"in wheels/{cell.id}/; lock {result.lock.digest[:12]} -> {path}"
    )


@command.command(name="verify")
@cell_argument
@json_option
def verify_cmd(cell_id: str, as_json: bool) -> None:
    """Re-hash the wheelhouse against CELL's lock (exit 4 on any difference)."""
    layout = project_layout()
    cell = load_cell(layout, cell_id)
    lock = current_lock(layout, cell)
    root = layout.root
    mismatches = verify_wheelhouse(lock, root)
    if as_json:
        echo_json({"cell": cell.id, "ok": not mismatches, "checked": len(lock.wheels),
                   "mismatches": [{"filename": m.filename, "expected": m.expected,
                                   "actual": m.actual} for m in mismatches]})
    else:
        for mismatch in mismatches:
            click.echo(f"MISMATCH {mismatch}")
    if mismatches:
        msg_0 = (
            f"{cell.id}: {len(mismatches)} of {len(lock.wheels)} wheels differ from the lock; "
            f"re-fetch with 'stackpin wheels fetch {cell.id}'"
        )
        raise ValidationError(
            msg_0
        )
    if not as_json:
        click.echo(f"wheelhouse of {cell.id}: {len(lock.wheels)} wheels match the lock")
