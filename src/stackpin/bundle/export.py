"""Writing a bundle: resolve once, save the image streams, plan the files, one writer.

``export`` is a short pipeline of stages that take the resolved value, never the
request: ``resolved.resolve`` finds each built image with the record and Dockerfile that
made it; the images (and, for ``--with-wheels``, the bases) are saved as streams;
``contents.plan`` lists every other file as an Entry; the writer here puts the entries
in a staging folder, refuses secrets, hashes everything into SHA256SUMS and the
manifest, signs, packs the archive, and the folder is swapped into place.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from stackpin.bundle import contents, models, source
from stackpin.bundle.format import (
    EXECUTABLE,
    IMAGES,
    MANIFEST,
    MAX_SUMS_BYTES,
    SIGNATURE,
    SUMS,
    UNSIGNED,
    BundleImage,
    Entry,
    ExportRequest,
    FileEntry,
    LineSink,
    StreamStats,
    build_manifest,
    ignore_line,
    manifest_bytes,
    sha256sums_text,
)
from stackpin.bundle.resolved import Resolved, resolve
from stackpin.bundle.secrets import scan_files
from stackpin.bundle.stream import write_images
from stackpin.engine import Engine
from stackpin.errors import BundleError
from stackpin.lock import atomic_write
from stackpin.meter import NO_METER, Meter
from stackpin.primitives import (
    CHUNK,
    HashingWriter,
    sha256_file,
    staged_folder,
    tar_directory,
    tar_end,
    tar_member,
)


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    out_dir: Path
    archive: Path | None
    manifest_sha256: str
    images: tuple[BundleImage, ...]
    stream: StreamStats
    signed_by: str | None


def export(engine: Engine, request: ExportRequest, *,
           on_line: LineSink = ignore_line, meter: Meter = NO_METER) -> ExportResult:
    """Write the bundle at ``request.out_dir`` (and ``<out_dir>.tar`` with ``archive``)."""
    out_dir = request.out_dir
    archive = out_dir.with_name(out_dir.name + ".tar") if request.archive else None
    for target in (out_dir, archive):
        if target is not None and target.exists() and not request.force:
            msg = f"{target} exists: choose another -o or pass --force to replace it"
            raise BundleError(msg)
    resolved = resolve(engine, request, archive=archive)
    with staged_folder(out_dir) as staging, ThreadPoolExecutor(max_workers=1) as beside:
        on_line("bundle: writing the SBOMs (package inventories from the build records, or "
                "probed in the images) beside the save")
        # A probe waits on a container start and the image's own Python, the documents'
        # schema check on jsonschema, the save on the daemon's stream and zstd: run
        # together, the SBOMs cost the export next to nothing.
        probed = beside.submit(contents.sbom_entries, engine, resolved)
        stream, images, streamed = _save_images(engine, resolved, staging, on_line=on_line,
                                                meter=meter)
        entries = contents.plan(resolved, images, stream, sboms=probed.result())
        manifest = _write(staging, entries, resolved, images, stream, streamed=streamed,
                          on_line=on_line)
    return ExportResult(out_dir=out_dir, archive=archive,
                        manifest_sha256=hashlib.sha256(manifest).hexdigest(),
                        images=tuple(images), stream=stream, signed_by=resolved.signed_by)


def _save_images(engine: Engine, resolved: Resolved, staging: Path, *, on_line: LineSink,
                 meter: Meter) -> tuple[StreamStats, list[BundleImage], dict[str, str]]:
    """images.tar.zst, every image in one stream (each image learns the IDs it loads as),
    and for ``--with-wheels`` each cell's base for offline rebuilds; with the sha256 of
    every stream written, taken as it was written."""
    built = resolved.built
    names = sorted({t for item in built for t in item.image.tags})
    on_line(f"bundle: saving {len(built)} image(s) as one stream: {', '.join(names)}")
    held = resolved.against.chains if resolved.against is not None else frozenset()
    stream, bundled = write_images(engine, names, staging / IMAGES, threads=resolved.threads,
                                   meter=meter, held=held, frame_cache=resolved.frame_cache)
    (staging / IMAGES).chmod(0o644)
    on_line(f"bundle: {IMAGES}: {stream.tar_bytes} -> {stream.bytes} bytes")
    if resolved.against is not None:
        left = sorted({b.diff_id for image in bundled.values() for b in image.base_layers})
        on_line(f"bundle: delta against the site inventory: {len(left)} layer(s) the site "
                "holds left out")
    streamed = {IMAGES: stream.sha256}
    for path, reference in (source.base_streams(built) if resolved.with_wheels else {}).items():
        on_line(f"bundle: saving the base {reference} as {path} for offline rebuilds")
        (staging / path).parent.mkdir(parents=True, exist_ok=True)
        base, _ = write_images(engine, [reference], staging / path, threads=resolved.threads,
                               frame_cache=resolved.frame_cache)
        (staging / path).chmod(0o644)
        streamed[path] = base.sha256
    images = [replace(item.image, config_digest=bundled[item.image.id].config_digest,
                      manifest_digest=bundled[item.image.id].manifest_digest,
                      base_layers=bundled[item.image.id].base_layers) for item in built]
    return stream, images, streamed


# --- the writer -------------------------------------------------------------------------


def _write(staging: Path, entries: Sequence[Entry], resolved: Resolved,
           images: Sequence[BundleImage], stream: StreamStats, *,
           streamed: Mapping[str, str], on_line: LineSink) -> bytes:
    """Put the entries in ``staging``; refuse secrets and user state; write SHA256SUMS,
    the manifest (returned) and its signature; pack the archive.

    Every file's sha256 is the one taken as it was written (``streamed``: the image
    streams; the entries: as ``_put`` wrote them), so no file of the bundle is read again
    to list it; only a file that came otherwise would be.
    """
    written = {**streamed, **_put(staging, entries)}
    listed = [p for p in _listing(staging) if p not in (*UNSIGNED, SUMS)]
    scan_files(staging, listed)
    models.refuse_user_state(staging, listed)
    files = [
        FileEntry(path=p, size=(staging / p).stat().st_size,
                  sha256=written.get(p) or sha256_file(staging / p))
        for p in listed
    ]
    sums = sha256sums_text(files).encode()
    if len(sums) > MAX_SUMS_BYTES:
        msg = (f"{SUMS} would be {len(sums)} bytes, more than the site scripts read "
               f"({MAX_SUMS_BYTES}): bundle fewer files (leave out --with-wheels or models)")
        raise BundleError(msg)
    files.append(FileEntry(path=SUMS, size=len(sums),
                           sha256=_put(staging, [Entry(path=SUMS, data=sums)])[SUMS]))
    manifest = manifest_bytes(build_manifest(
        selections=resolved.selections, images=images, files=files, stream=stream,
        layout_version=contents.layout_version(resolved.layout),
        with_wheels=resolved.with_wheels, signed_by=resolved.signed_by,
        against=resolved.against.sha256 if resolved.against is not None else None,
    ))
    _put(staging, [Entry(path=MANIFEST, data=manifest)])
    if resolved.signer is not None:
        _put(staging, [Entry(path=SIGNATURE, data=resolved.signer.sign(manifest))])
    if resolved.archive is not None:
        on_line(f"bundle: packing {resolved.archive}")
        with atomic_write(resolved.archive) as tmp:
            pack_archive(staging, tmp, top=resolved.top, mtime=resolved.epoch)
    return manifest


def _put(staging: Path, entries: Sequence[Entry]) -> dict[str, str]:
    """Put each entry in place (scripts executable, every other file 0644); return each
    one's sha256, taken from the bytes written (a copied wheel is hashed while copied)."""
    digests = {}
    for entry in entries:
        path = staging / entry.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry.source is not None:
            digest = _copy_hashing(entry.source, path)
        else:
            path.write_bytes(entry.data or b"")
            digest = hashlib.sha256(entry.data or b"").hexdigest()
        path.chmod(0o755 if EXECUTABLE.match(entry.path) else 0o644)
        digests[entry.path] = digest
        if entry.sha256 and digest != entry.sha256:
            cell = PurePosixPath(entry.path).parent.name
            msg = (
                f"{path.name} does not hash to its lock entry: the wheelhouse changed; "
                f"run `stackpin wheels fetch {cell}` and rebuild before exporting"
            )
            raise BundleError(msg)
    return digests


def _copy_hashing(source_path: Path, target: Path) -> str:
    """Copy ``source_path`` to ``target``; the sha256 of the bytes written."""
    with source_path.open("rb") as src, target.open("wb") as out:
        writer = HashingWriter(out)
        shutil.copyfileobj(src, writer, CHUNK)
    return writer.sha256.hexdigest()


def _listing(folder: Path) -> list[str]:
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
    )


def pack_archive(folder: Path, target: Path, *, top: str, mtime: int) -> None:
    """One uncompressed tar of the bundle (its big file is compressed already), its
    files under ``top``/.

    Fixed order (manifest first, so a streaming reader can check each member as it
    comes), owner 0/0 without names, fixed modes and mtimes: same folder, same bytes.
    """
    files = _listing(folder)
    first = [p for p in (MANIFEST, SIGNATURE) if p in files]
    ordered = first + [p for p in files if p not in first]
    dirs = sorted({str(parent) for p in ordered for parent in PurePosixPath(p).parents} - {"."})
    with target.open("wb") as out:  # PAX: names of any length
        for name in (top, *(f"{top}/{rel}" for rel in dirs)):
            out.write(tar_directory(name, mtime=mtime, fmt=tarfile.PAX_FORMAT))
        for rel in ordered:
            path = folder / rel
            mode = 0o755 if EXECUTABLE.match(rel) else 0o644
            with path.open("rb") as handle:
                for chunk in tar_member(f"{top}/{rel}", handle, path.stat().st_size,
                                        mtime=mtime, mode=mode, fmt=tarfile.PAX_FORMAT):
                    out.write(chunk)
        out.write(tar_end(out.tell()))
