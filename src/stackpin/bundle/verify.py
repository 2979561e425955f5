"""Verifying a bundle folder or archive completely, streaming, never extracting.

Order matters, and is the same for a folder and an archive:

1. ``manifest.json`` and ``manifest.sig`` are read with size caps (nothing else is read
   whole, ever);
2. the signature is checked over the exact manifest bytes against the site's key
   (``trust``), before one field is interpreted;
3. the manifest is parsed under strict JSON rules and validated against its schema;
4. sizes are compared before any hashing, then every file is hashed in 1 MiB chunks.

An archive is read once, in stream mode, through a tar reader whose extended headers
are capped, with an allow-list of members (regular files and folders under one top
folder). Memory stays bounded by the caps whatever the input.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from stackpin.bundle import schema, trust
from stackpin.bundle.format import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    SIGNATURE,
    SITE_MODELS,
    SUMS,
    UNSIGNED,
    FileEntry,
    SignatureState,
    safe_relative,
    sha256sums_text,
)
from stackpin.errors import BundleError
from stackpin.meter import NO_METER, Meter, MeteredReader
from stackpin.primitives import CHUNK, hash_stream
from stackpin.signing import SIGNATURE_BYTES
from stackpin.tarstream import TarStream, read_tar_stream
from stackpin.untrusted import parse_json, read_bounded, shown

MAX_MEMBERS = schema.MAX_FILES + 10_000  # files plus their folders
MAX_TAR_HEADER = 64 << 10  # one pax or GNU long-name header


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    source: Path
    kind: Literal["directory", "archive"]
    manifest: Mapping[str, Any]
    signature: SignatureState
    files: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "kind": self.kind,
            "signature": self.signature,
            "signed_by": self.manifest.get("signed_by"),
            "files": self.files,
            "bytes": self.bytes,
            "images": [
                {k: i[k] for k in ("cell", "variant", "profile", "id", "tags")}
                for i in self.manifest["images"]
            ],
        }


def refuse(source: Path, reason: str) -> BundleError:
    return BundleError(
        f"{shown(source)}: {reason}; nothing was loaded: get a fresh copy of the bundle from "
        "the build host"
    )


def accept_manifest(source: Path, data: bytes, signature: bytes | None,
                    site: trust.Trust) -> tuple[dict[str, Any], SignatureState]:
    """The manifest, once its signature verified, parsed strictly and schema-checked."""
    state = trust.check(source, data, signature, site)
    try:
        document = parse_json(data, what=MANIFEST, error=BundleError)
        return schema.validate(document), state
    except BundleError as exc:
        msg = f"{shown(source)}: {exc.message}"
        raise BundleError(msg) from None


def member_problem(info: tarfile.TarInfo, top: str) -> str | None:
    """Why an archive member is not allowed, or None (regular files and folders only)."""
    name = info.name.rstrip("/") if info.isdir() else info.name
    label = shown(info.name)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return f"member {label!r} has an absolute path"
    if ".." in PurePosixPath(name).parts:
        return f"member {label!r} climbs out with '..'"
    if info.issym() or info.islnk():
        return f"member {label!r} is a link"
    if info.ischr() or info.isblk() or info.isfifo():
        return f"member {label!r} is a device or fifo"
    if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE):
        return f"member {label!r} is not a regular file or folder"
    if name != top and not (name.startswith(top + "/") and safe_relative(name[len(top) + 1:])):
        return f"member {label!r} is outside the bundle folder {shown(top)}/ or oddly named"
    return None


def compare_files(source: Path, manifest: Mapping[str, Any],
                  found: Mapping[str, tuple[int, str]]) -> None:
    """Every listed file present with its size and hash; nothing else; SHA256SUMS agrees."""
    listed = {str(e["path"]): e for e in manifest["files"]}
    _precheck(source, {p: int(e["size"]) for p, e in listed.items()},
              {p: size for p, (size, _) in found.items()})
    for path in sorted(listed):
        if found[path][1] != listed[path]["sha256"]:
            raise refuse(source, f"{path} does not match its sha256 (altered or damaged)")
    entries = [FileEntry(path=str(e["path"]), size=int(e["size"]), sha256=str(e["sha256"]))
               for e in manifest["files"]]
    # SHA256SUMS itself was hashed above; its expected text follows from the manifest, so
    # comparing hashes checks its content without holding the file.
    expected = hashlib.sha256(sha256sums_text(entries).encode()).hexdigest()
    if expected != listed[SUMS]["sha256"] or manifest["sha256sums"] != expected:
        raise refuse(source, f"{SUMS} disagrees with {MANIFEST}")


def verify(source: Path, *, site: trust.Trust, meter: Meter = NO_METER) -> VerifyResult:
    """Check a bundle folder or archive completely, without extracting anything.

    ``meter`` counts the bytes hashed ("verify"): the listed files of a folder, every byte
    of an archive.
    """
    try:
        mode = source.lstat().st_mode
    except OSError:
        msg = f"{shown(source)} does not exist: pass a bundle folder or its .tar"
        raise BundleError(msg) from None
    if stat.S_ISDIR(mode):
        return _verify_dir(source, site, meter)
    if stat.S_ISREG(mode):
        return _verify_archive(source, site, meter)
    raise refuse(source, "is not a bundle folder or a regular .tar file (a link or device)")


def _walk(folder: Path) -> list[str]:
    """Every regular file under ``folder``; any link, device or other node is refused."""
    found: list[str] = []
    entries = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        entries += len(dirnames) + len(filenames)
        if entries > MAX_MEMBERS:  # folders count too: os.walk holds their names
            raise refuse(folder, f"holds more than {MAX_MEMBERS} files and folders")
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            rel = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(mode):
                raise refuse(folder, f"{shown(rel)} is a link")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise refuse(folder, f"{shown(rel)} is a device, fifo or socket")
            if stat.S_ISREG(mode):
                # The site's own models may be named as it likes (never hashed or printed raw).
                if not safe_relative(rel) and not rel.startswith(SITE_MODELS):
                    raise refuse(folder, f"'{shown(rel)}' is not a bundle file name")
                found.append(rel)
    return sorted(found)


def _read_top(folder: Path, rel: str, limit: int) -> bytes:
    return read_bounded(folder / rel, limit=limit, what=rel, error=BundleError,
                        follow_links=False)


def _verify_dir(folder: Path, site: trust.Trust, meter: Meter) -> VerifyResult:
    paths = _walk(folder)
    if MANIFEST not in paths:
        raise refuse(folder, f"{MANIFEST} is missing")
    try:
        data = _read_top(folder, MANIFEST, MAX_MANIFEST_BYTES)
        signature = (_read_top(folder, SIGNATURE, SIGNATURE_BYTES) if SIGNATURE in paths
                     else None)
    except BundleError as exc:
        raise refuse(folder, exc.message) from None
    manifest, state = accept_manifest(folder, data, signature, site)
    listed = {str(e["path"]): int(e["size"]) for e in manifest["files"]}
    present = [p for p in paths if p not in UNSIGNED
               and (p in listed or not p.startswith(SITE_MODELS))]
    # Cheap checks first: missing, extra and truncated files before hashing gigabytes.
    sizes = {p: (folder / p).stat().st_size for p in present}
    _precheck(folder, listed, sizes)
    meter.start("verify", sum(sizes.values()))
    found = {p: _hash_file(folder / p, meter) for p in present}
    meter.finish()
    compare_files(folder, manifest, found)
    return VerifyResult(source=folder, kind="directory", manifest=manifest, signature=state,
                        files=len(found), bytes=sum(s for s, _ in found.values()))


def _precheck(source: Path, listed: Mapping[str, int], sizes: Mapping[str, int]) -> None:
    for path in sorted(listed):
        if path not in sizes:
            raise refuse(source, f"{path} is missing")
    for path in sorted(sizes):
        if path not in listed:
            raise refuse(source, f"{shown(path)} is not in the manifest (an extra file)")
        if sizes[path] != listed[path]:
            raise refuse(source, f"{path} is {sizes[path]} bytes, not {listed[path]} "
                          "(truncated or altered)")


class BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads pax and GNU long-name headers whole and expands sparse maps: capped."""

    def _proc_pax(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        self._cap()
        info: tarfile.TarInfo = super()._proc_pax(archive)  # type: ignore[misc]
        return info

    def _proc_gnulong(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        self._cap()
        info: tarfile.TarInfo = super()._proc_gnulong(archive)  # type: ignore[misc]
        return info

    def _proc_sparse(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        msg = "a sparse member"
        raise tarfile_error(msg)

    def _cap(self) -> None:
        if self.size > MAX_TAR_HEADER:
            msg = f"an extended header of {self.size} bytes"
            raise tarfile_error(msg)


def tarfile_error(message: str) -> tarfile.HeaderError:
    return tarfile.HeaderError(message)


def open_stream(handle: IO[bytes]) -> TarStream:
    """A stream-mode tar reader with capped headers."""
    return read_tar_stream(handle, tarinfo=BoundedTarInfo)


class _ArchiveScan:
    """One streaming pass over a bundle archive: every member checked, hashed, never written.

    The manifest is accepted (signature, then schema) as soon as it and its signature have
    been read, which in a stackpin archive is before any other member; from then on each
    member is checked against it by its header, before its data is read.
    """

    def __init__(self, source: Path, site: trust.Trust) -> None:
        self.source = source
        self.site = site
        self.top = ""
        self.members = 0
        self.seen: set[str] = set()
        self.manifest_data: bytes | None = None
        self.signature: bytes | None = None
        self.manifest: dict[str, Any] | None = None
        self.state: SignatureState | None = None
        self.found: dict[str, tuple[int, str]] = {}

    def member(self, tar: TarStream, info: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise refuse(self.source, f"the archive has more than {MAX_MEMBERS} members")
        if not self.top:
            self.top = PurePosixPath(info.name).parts[0] if info.name else ""
            if not self.top or self.top in (".", "..") or info.name.startswith("/"):
                raise refuse(self.source,
                             f"member {shown(info.name)!r} is not under one bundle folder")
        problem = member_problem(info, self.top)
        if problem:
            raise refuse(self.source, problem)
        if info.isdir():
            return
        rel = info.name[len(self.top) + 1:]
        if rel in self.seen:
            raise refuse(self.source, f"{rel} appears twice in the archive")
        self.seen.add(rel)
        handle = tar.extractfile(info)
        assert handle is not None
        if rel in UNSIGNED:
            self._small(rel, info.size, handle)
            return
        if self.manifest_data is None:
            raise refuse(self.source, f"{shown(rel)} comes before {MANIFEST}: a stackpin "
                         "archive starts with the manifest and its signature")
        self.accept()
        self._check_header(rel, info.size)
        self.found[rel] = hash_stream(handle)

    def _small(self, rel: str, size: int, handle: IO[bytes]) -> None:
        if self.manifest is not None:
            raise refuse(self.source, f"{rel} comes after other members")
        limit = MAX_MANIFEST_BYTES if rel == MANIFEST else SIGNATURE_BYTES
        if size > limit:
            raise refuse(self.source, f"{rel} is larger than {limit} bytes")
        data = handle.read(limit)
        if rel == SIGNATURE:
            self.signature = data
        else:
            self.manifest_data = data

    def accept(self) -> None:
        """Check the signature, then the schema, once: at the first other member or the end."""
        if self.manifest is None and self.manifest_data is not None:
            self.manifest, self.state = accept_manifest(
                self.source, self.manifest_data, self.signature, self.site)

    def _check_header(self, rel: str, size: int) -> None:
        assert self.manifest is not None
        listed = {str(e["path"]): int(e["size"]) for e in self.manifest["files"]}
        if rel not in listed:
            raise refuse(self.source, f"{shown(rel)} is not in the manifest (an extra file)")
        if size != listed[rel]:
            raise refuse(self.source, f"{rel} is {size} bytes, not {listed[rel]} "
                         "(truncated or altered)")

    def finish(self) -> VerifyResult:
        if self.manifest_data is None:
            raise refuse(self.source, f"{MANIFEST} is missing")
        self.accept()
        assert self.manifest is not None
        assert self.state is not None
        compare_files(self.source, self.manifest, self.found)
        return VerifyResult(source=self.source, kind="archive", manifest=self.manifest,
                            signature=self.state, files=len(self.found),
                            bytes=sum(s for s, _ in self.found.values()))


def _hash_file(path: Path, meter: Meter) -> tuple[int, str]:
    with path.open("rb") as handle:
        return hash_stream(MeteredReader(handle, meter))  # type: ignore[arg-type]


def _verify_archive(source: Path, site: trust.Trust, meter: Meter) -> VerifyResult:
    scan = _ArchiveScan(source, site)
    try:
        with source.open("rb") as raw:
            meter.start("verify", os.fstat(raw.fileno()).st_size)
            counted = MeteredReader(raw, meter)
            with open_stream(counted) as tar:  # type: ignore[arg-type]
                for info in tar:
                    scan.member(tar, info)
            while counted.read(CHUNK):  # the archive's zero padding after its end marker
                pass
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise refuse(source, f"the archive is unreadable or truncated ({shown(exc)})") from None
    meter.finish()
    return scan.finish()


# --- inspect ------------------------------------------------------------------------------


def read_manifest(source: Path, *, site: trust.Trust) -> dict[str, Any]:
    """The manifest of a folder or archive, signature-checked (for inspect; files unchecked)."""
    try:
        is_dir = stat.S_ISDIR(source.lstat().st_mode)
    except OSError:
        msg = f"{shown(source)} does not exist: pass a bundle folder or its .tar"
        raise BundleError(msg) from None
    if is_dir:
        try:
            data = _read_top(source, MANIFEST, MAX_MANIFEST_BYTES)
            signature = (_read_top(source, SIGNATURE, SIGNATURE_BYTES)
                         if (source / SIGNATURE).exists() else None)
        except BundleError as exc:
            raise refuse(source, exc.message) from None
        return accept_manifest(source, data, signature, site)[0]
    scan = _ArchiveScan(source, site)
    try:
        with source.open("rb") as handle, open_stream(handle) as tar:
            for info in tar:
                if info.isdir():
                    scan.member(tar, info)
                    continue
                rel = info.name.partition("/")[2]
                if rel not in UNSIGNED:
                    break
                scan.member(tar, info)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise refuse(source, f"the archive is unreadable ({shown(exc)})") from None
    if scan.manifest_data is None:
        raise refuse(source, f"{MANIFEST} is missing")
    scan.accept()
    assert scan.manifest is not None
    return scan.manifest
