"""``stackpin bundle``: export, inspect, verify and load offline bundles."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType

import click

from stackpin import signing
from stackpin.bundle import delta, trust
from stackpin.bundle import export as exporting
from stackpin.bundle import format as bundle_format
from stackpin.bundle import load as loading
from stackpin.bundle import verify as verifying
from stackpin.cache import cache_dir
from stackpin.cli.common import (
    DEFAULT_CELL,
    ENGINE,
    ExistingPath,
    cells_argument,
    echo_json,
    json_option,
    output_folder,
    project_layout,
    trust_options,
    variant_option,
)
from stackpin.cli.progress import ByteProgress
from stackpin.errors import BundleError
from stackpin.target import Layout, resolve_many
from stackpin.untrusted import read_bounded, shown

_SOURCE = ExistingPath("either")


def _site(pubkey: Path | None, insecure_unsigned: bool) -> trust.Trust:
    return trust.resolve(pubkey, insecure_unsigned=insecure_unsigned)


def _say(site: trust.Trust, line: str, *, err: bool = False) -> None:
    """One output line; with the opt-out, every line carries the warning."""
    suffix = f"  [{trust.INSECURE_NOTE}]" if site.insecure else ""
    click.echo(shown(line, limit=4000) + suffix, err=err)


def selections(
    cell_ids: tuple[str, ...], variant: str, layout: Layout
) -> tuple[bundle_format.Selection, ...]:
    return tuple(bundle_format.Selection(cell=t.cell, variant=t.variant, lock=t.lock)
                 for t in resolve_many(layout, cell_ids or (DEFAULT_CELL,), variant))


def _interrupt_on_term(_signum: int, _frame: FrameType | None) -> None:
    # SIGTERM takes the same path as Ctrl-C: the staging folder is removed in `finally`.
    raise KeyboardInterrupt


def _echo(line: str) -> None:
    click.echo(line, err=True)


@click.group(name="bundle")
def command() -> None:
    """Offline bundles for air-gapped sites (images, signed manifest, SBOMs, site scripts)."""


@command.command(name="export")
@cells_argument
@variant_option(help="Which image(s) of each cell.")
@click.option("-o", "--out", "out_dir", type=output_folder(), required=True,
              help="The bundle folder to write (created by a rename at the end).")
@click.option("--archive", is_flag=True, help="Also pack the folder into OUT.tar.")
@click.option("--sign-key", type=ExistingPath("file"),
              help="stackpin.key to sign manifest.json with (`stackpin keys generate`).")
@click.option("--with-wheels", is_flag=True,
              help="Include what `stackpin build --offline` needs to rebuild the images at the "
                   "site: the locked wheelhouse, the matrix, the templates, verify/.")
@click.option("--with-models", is_flag=True,
              help="Ship the model folders of models/ (each must declare its licence in a "
                   "README.md model card); without it models/ holds only its README.")
@click.option("--force", is_flag=True, help="Replace an existing bundle at OUT.")
@click.option("--allow-rehearsal", "allow_rehearsal", multiple=True, metavar="CELL",
              help="Bundle this cell's vendor rehearsal image (stand-in vendor files) on "
                   "purpose; without it a rehearsal image is refused. Repeatable.")
@click.option("--against", "inventory", type=ExistingPath("file"), metavar="INVENTORY",
              help="A delta bundle: leave out every layer the site's inventory (written there "
                   "by bin/inventory.sh) says it holds. The manifest still names each image "
                   "whole; the site's load.sh and push.sh refuse it where those layers are "
                   "absent.")
@click.option("--no-cache", is_flag=True,
              help="Compress every layer anew: neither copy the frames earlier exports kept "
                   "($STACKPIN_CACHE_DIR/frames, default ~/.cache/stackpin/frames) nor keep "
                   "this export's. The bundle's bytes are the same either way.")
@json_option
def export(cell_ids: tuple[str, ...], variant: str, out_dir: Path, archive: bool,
           sign_key: Path | None, with_wheels: bool, with_models: bool, force: bool,
           allow_rehearsal: tuple[str, ...], inventory: Path | None, no_cache: bool,
           as_json: bool) -> None:
    """Export built images of CELL(s) (default: the CPU default cell) as one bundle.

    Every image goes into ONE docker save stream, compressed with zstd and hashed on the
    way to disk; a layer an earlier export on this machine compressed (Docker 25 and
    later) is hashed as the save sends it and its kept frame copied. The export refuses
    images or files carrying secrets. Killing it leaves nothing at OUT. Byte progress goes
    to stderr (a bar on a terminal, a line every 10 s otherwise), as for verify and load.
    """
    layout = project_layout()
    against = None
    if inventory is not None:  # read and checked before anything else runs
        data = read_bounded(inventory, limit=delta.MAX_INVENTORY_BYTES,
                            what=f"--against {shown(inventory)}", error=BundleError)
        against = delta.parse_inventory(data, what=f"--against {shown(inventory)}")
    request = bundle_format.ExportRequest(
        selections=selections(cell_ids, variant, layout), out_dir=out_dir.absolute(),
        root=layout.root, archive=archive, with_wheels=with_wheels,
        signer=signing.Signer.load(sign_key) if sign_key else None,
        with_models=with_models, force=force, allow_rehearsal=frozenset(allow_rehearsal),
        against=against, frame_cache=None if no_cache else cache_dir() / "frames",
    )
    previous = signal.signal(signal.SIGTERM, _interrupt_on_term)
    started = time.monotonic()
    try:
        with ENGINE.open() as engine:
            result = exporting.export(engine, request, on_line=_echo, meter=ByteProgress())
    finally:
        signal.signal(signal.SIGTERM, previous)
    seconds = round(time.monotonic() - started, 2)
    if as_json:
        echo_json({
            "out_dir": str(result.out_dir),
            "archive": str(result.archive) if result.archive else None,
            "manifest_sha256": result.manifest_sha256,
            "signed_by": result.signed_by,
            "images": [{"profile": i.profile, "id": i.id, "tags": list(i.tags)}
                       for i in result.images],
            "tar_bytes": result.stream.tar_bytes,
            "bytes": result.stream.bytes,
            "seconds": seconds,
        })
        return
    click.echo(
        f"bundle: {result.out_dir} ({len(result.images)} image(s), "
        f"{result.stream.bytes / 2**20:.0f} MiB from {result.stream.tar_bytes / 2**20:.0f} MiB, "
        f"{'signed ' + result.signed_by if result.signed_by else 'unsigned'}, {seconds:.0f} s)"
    )
    if result.archive:
        click.echo(f"bundle: archive {result.archive}")


@command.command(name="inspect")
@click.argument("source", type=_SOURCE)
@trust_options
@json_option
def inspect(source: Path, pubkey: Path | None, insecure_unsigned: bool, as_json: bool) -> None:
    """Show a bundle's manifest (images, inputs, files) once its signature verified.

    The files themselves are not checked: that is `bundle verify`.
    """
    site = _site(pubkey, insecure_unsigned)
    manifest = verifying.read_manifest(source, site=site)
    if as_json:
        echo_json({**manifest, "insecure": site.insecure} if site.insecure else manifest)
        return
    signer = manifest["signed_by"]
    _say(site, f"bundle: {source} format {manifest['format_version']}, created "
               f"{manifest['created']}, {f'signed {signer}' if signer else 'unsigned'}")
    for image in manifest["images"]:
        _say(site, f"  {image['profile']:20} {image['tags'][0]:60} {image['id'][7:19]} "
                   f"127.0.0.1:{image['port']}")
    total = sum(int(f["size"]) for f in manifest["files"])
    _say(site, f"  {len(manifest['files'])} files, {total / 2**20:.1f} MiB")


@command.command(name="verify")
@click.argument("source", type=_SOURCE)
@trust_options
@json_option
def verify(source: Path, pubkey: Path | None, insecure_unsigned: bool, as_json: bool) -> None:
    """Check the signature (against the site's key), every file and the file list.

    Streams; never extracts. Refuses an unsigned or foreign-signed bundle unless
    --insecure-unsigned.
    """
    site = _site(pubkey, insecure_unsigned)
    result = verifying.verify(source, site=site, meter=ByteProgress())
    if as_json:
        echo_json({"ok": True, "insecure": site.insecure, **result.to_json()})
        return
    _say(site, f"bundle: {source} OK: {result.files} files, {result.bytes / 2**20:.1f} MiB, "
               f"signature {result.signature}")


@command.command(name="load")
@click.argument("source", type=_SOURCE)
@trust_options
@json_option
def load(source: Path, pubkey: Path | None, insecure_unsigned: bool, as_json: bool) -> None:
    """Verify the bundle completely, then load its images and confirm their IDs."""
    site = _site(pubkey, insecure_unsigned)
    with ENGINE.open() as engine:
        report = loading.load(engine, source, site=site, meter=ByteProgress(),
                              on_line=lambda line: _say(site, line, err=True))
    if as_json:
        echo_json({"ok": True, "insecure": site.insecure, **report.verified.to_json(),
                   "loaded": list(report.image_ids)})
        return
    for image_id in report.image_ids:
        _say(site, f"bundle: loaded {image_id}")
