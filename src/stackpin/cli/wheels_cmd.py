"""``stackpin wheels``: fill and verify the offline wheelhouse."""

from __future__ import annotations

import click

from stackpin.cache import cache_dir
from stackpin.checks import require_resolvable
from stackpin.cli.common import cell_argument, echo_json, json_option, project_layout
from stackpin.errors import ValidationError
from stackpin.lock import lock_path, relock
from stackpin.render import base_reference
from stackpin.resolve import Pip
from stackpin.target import current_lock, load_cell
from stackpin.tools import fetch_installer, load_installer
from stackpin.wheelhouse import fetch, verify_wheelhouse


@click.group(name="wheels")
def command() -> None:
    """Fetch wheels for a cell's target on a connected host; verify them offline."""


@command.command(name="fetch")
@cell_argument
@click.option("-v", "--verbose", is_flag=True, help="Show pip's output as it runs.")
@click.option("--no-cache", is_flag=True,
              help="Download every wheel from the index: neither take wheels from the "
                   "machine-wide wheel cache nor keep them there.")
@json_option
def fetch_cmd(cell_id: str, verbose: bool, no_cache: bool, as_json: bool) -> None:
    """Download CELL's locked index wheels for its CPython/ABI/platform into wheels/CELL/.

    Without a current lock the cell is resolved and locked first (stackpin lock). The
    download is exact and hash-checked. Vendor files (DTK torch, DTK FlashAttention, vLLM)
    are never downloaded: the command lists each one wheels/vendor/ must hold.

    Wheels already in the machine-wide cache ($STACKPIN_CACHE_DIR/wheels, default
    ~/.cache/stackpin/wheels, shared by every checkout on the host) are re-hashed against
    the lock and hard-linked in, not downloaded; what pip downloads is kept there.
    """
    layout = project_layout()
    root = layout.root
    cell = load_cell(layout, cell_id)
    require_resolvable(cell)

    def show(line: str) -> None:
        if verbose:
            click.echo(f"  {line}", err=True)

    lock, new = relock(cell, root, Pip(on_line=show), base_reference=base_reference(cell))
    result = fetch(cell, root, lock, on_line=show,
                   cache=None if no_cache else cache_dir())
    # The installer every build runs: pinned apart from the lock, fetched with the wheels.
    fetch_installer(load_installer(root), root, on_line=show)
    path = lock_path(root, cell.id)
    if as_json:
        echo_json({"cell": cell.id, "mode": "resolved" if new else "locked",
                   "wheels": result.wheel_count, "cached": result.cached,
                   "bytes": result.bytes, "lock": str(path),
                   "digest": lock.digest,
                   "vendor": [{"filename": v.filename, "name": v.name, "version": v.version,
                               "sha256": v.sha256, "present": v.present}
                              for v in result.vendor]})
        return
    click.echo(
        f"wheels: {result.wheel_count} wheels ({result.bytes / 2**20:.0f} MiB, "
        f"{'resolved' if new else 'locked'}, {result.cached} from the wheel cache) in "
        f"wheels/{cell.id}/; "
        f"lock {lock.digest[:12]} -> {path}"
    )
    for vendor in result.vendor:
        click.echo(f"vendor file for wheels/vendor/: {vendor.line()}")


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
        echo_json({"cell": cell.id, "ok": not mismatches, "checked": len(lock.installed()),
                   "mismatches": [{"filename": m.filename, "expected": m.expected,
                                   "actual": m.actual} for m in mismatches]})
    else:
        for mismatch in mismatches:
            click.echo(f"MISMATCH {mismatch}")
    if mismatches:
        msg_0 = (
            f"{cell.id}: {len(mismatches)} of {len(lock.installed())} wheels differ from the lock; "
            f"re-fetch with 'stackpin wheels fetch {cell.id}'"
        )
        raise ValidationError(
            msg_0
        )
    if not as_json:
        click.echo(f"wheelhouse of {cell.id}: {len(lock.installed())} wheels match the lock")
