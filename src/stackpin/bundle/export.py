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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from stackpin.bundle import contents, models, source
from stackpin.bundle.format import (
    EXECUTABLE,
    IMAGES,
    MANIFEST,
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
    with staged_folder(out_dir) as staging:
        stream, images = _save_images(engine, resolved, staging, on_line=on_line, meter=meter)
        on_line("bundle: reading package inventories (SBOM) from the images")
        entries = contents.plan(engine, resolved, images, stream)
        manifest = _write(staging, entries, resolved, images, stream, on_line=on_line)
    return ExportResult(out_dir=out_dir, archive=archive,
                        manifest_sha256=hashlib.sha256(manifest).hexdigest(),
                        images=tuple(images), stream=stream, signed_by=resolved.signed_by)


def _save_images(engine: Engine, resolved: Resolved, staging: Path, *, on_line: LineSink,
                 meter: Meter) -> tuple[StreamStats, list[BundleImage]]:
    """images.tar.zst, every image in one stream (each image learns the IDs it loads as),
    and for ``--with-wheels`` each cell's base for offline rebuilds."""
    built = resolved.built
    names = sorted({t for item in built for t in item.image.tags})
    on_line(f"bundle: saving {len(built)} image(s) as one stream: {', '.join(names)}")
    stream, bundled = write_images(engine, names, staging / IMAGES, threads=resolved.threads,
                                   meter=meter)
    (staging / IMAGES).chmod(0o644)
    on_line(f"bundle: {IMAGES}: {stream.tar_bytes} -> {stream.bytes} bytes")
    for path, reference in (source.base_streams(built) if resolved.with_wheels else {}).items():
        on_line(f"bundle: saving the base {reference} as {path} for offline rebuilds")
        (staging / path).parent.mkdir(parents=True, exist_ok=True)
        write_images(engine, [reference], staging / path, threads=resolved.threads)
        (staging / path).chmod(0o644)
    images = [replace(item.image, config_digest=bundled[item.image.id].config_digest,
                      manifest_digest=bundled[item.image.id].manifest_digest) for item in built]
    return stream, images


# --- the writer -------------------------------------------------------------------------


def _write(staging: Path, entries: Sequence[Entry], resolved: Resolved,
           images: Sequence[BundleImage], stream: StreamStats, *, on_line: LineSink) -> bytes:
    """Put the entries in ``staging``; refuse secrets and user state; write SHA256SUMS,
    the manifest (returned) and its signature; pack the archive."""
    _put(staging, entries)
    listed = [p for p in _listing(staging) if p not in (*UNSIGNED, SUMS)]
    scan_files(staging, listed)
    models.refuse_user_state(staging, listed)
    files = [
        FileEntry(path=p, size=(staging / p).stat().st_size,
                  sha256=stream.sha256 if p == IMAGES else sha256_file(staging / p))
        for p in listed
    ]
    _put(staging, [Entry(path=SUMS, data=sha256sums_text(files).encode())])
    files.append(FileEntry(path=SUMS, size=(staging / SUMS).stat().st_size,
                           sha256=sha256_file(staging / SUMS)))
    manifest = manifest_bytes(build_manifest(
        selections=resolved.selections, images=images, files=files, stream=stream,
        layout_version=contents.layout_version(resolved.layout),
        with_wheels=resolved.with_wheels, signed_by=resolved.signed_by,
    ))
    _put(staging, [Entry(path=MANIFEST, data=manifest)])
    if resolved.signer is not None:
        _put(staging, [Entry(path=SIGNATURE, data=resolved.signer.sign(manifest))])
    if resolved.archive is not None:
        on_line(f"bundle: packing {resolved.archive}")
        with atomic_write(resolved.archive) as tmp:
            pack_archive(staging, tmp, top=resolved.top, mtime=resolved.epoch)
    return manifest


def _put(staging: Path, entries: Sequence[Entry]) -> None:
    """Put each entry in place (scripts executable, every other file 0644)."""
    for entry in entries:
        path = staging / entry.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry.source is not None:
            shutil.copyfile(entry.source, path)
        else:
            path.write_bytes(entry.data or b"")
        path.chmod(0o755 if EXECUTABLE.match(entry.path) else 0o644)
        if entry.sha256 and sha256_file(path) != entry.sha256:
            cell = PurePosixPath(entry.path).parent.name
            msg = (
                f"{path.name} does not hash to its lock entry: the wheelhouse changed; "
                f"run `stackpin wheels fetch {cell}` and rebuild before exporting"
            )
            raise BundleError(msg)


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
