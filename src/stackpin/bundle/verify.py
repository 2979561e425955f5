"""Verifying a bundle folder or archive completely, streaming, never extracting."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from stackpin import signing
from stackpin.bundle.format import (
    CHUNK,
    FORMAT,
    FORMAT_VERSION,
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
from stackpin.wheelhouse import sha256_file


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


# --- verification -----------------------------------------------------------------------


def refuse(source: Path, reason: str) -> BundleError:
    return BundleError(
        f"{source}: {reason}; nothing was loaded: get a fresh copy of the bundle from the "
        "build host"
    )


def member_problem(info: tarfile.TarInfo, top: str) -> str | None:
    """Why an archive member is not allowed, or None (regular files and folders only)."""
    name = info.name.rstrip("/") if info.isdir() else info.name
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return f"member {info.name!r} has an absolute path"
    if ".." in PurePosixPath(name).parts:
        return f"member {info.name!r} climbs out with '..'"
    if info.issym() or info.islnk():
        return f"member {info.name!r} is a link"
    if info.ischr() or info.isblk() or info.isfifo():
        return f"member {info.name!r} is a device or fifo"
    if not (info.isreg() or info.isdir()):
        return f"member {info.name!r} is not a regular file or folder"
    if name != top and not (name.startswith(top + "/") and safe_relative(name[len(top) + 1:])):
        return f"member {info.name!r} is outside the bundle folder {top}/"
    return None


def parse_manifest(source: Path, data: bytes) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads(data)
        ok = (manifest.get("format") == FORMAT and isinstance(manifest.get("files"), list)
              and isinstance(manifest.get("images"), list))
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        ok = False
    if not ok:
        raise refuse(source, f"{MANIFEST} is not a stackpin bundle manifest")
    if manifest["format_version"] != FORMAT_VERSION:
        msg = (
            f"{source}: bundle format {manifest['format_version']} is not {FORMAT_VERSION}; "
            "use the stackpin version that wrote it"
        )
        raise BundleError(msg)
    for entry in manifest["files"]:
        if not safe_relative(str(entry.get("path", ""))) or entry["path"] in UNSIGNED:
            raise refuse(source, f"{MANIFEST} lists an unsafe path {entry.get('path')!r}")
    return manifest


def check_signature(source: Path, data: bytes, signature: bytes | None,
                    pubkey: Path | None) -> SignatureState:
    if pubkey is None:
        return "not checked" if signature is not None else "absent"
    if signature is None:
        raise refuse(source, f"{SIGNATURE} is missing but a public key was given")
    signing.verify(data, signature, signing.load_public(pubkey), what=str(source))
    return "verified"


def compare_files(source: Path, manifest: Mapping[str, Any],
                  found: Mapping[str, tuple[int, str]], sums: bytes | None) -> None:
    """Every listed file present with its size and hash; nothing else; SHA256SUMS agrees."""
    listed = {str(e["path"]): e for e in manifest["files"]}
    for path in sorted(listed):
        if path not in found:
            raise refuse(source, f"{path} is missing")
    for path in sorted(found):
        if path not in listed:
            raise refuse(source, f"{path} is not in the manifest (an extra file)")
    for path in sorted(listed):
        size, digest = found[path]
        if size != listed[path]["size"]:
            raise refuse(source, f"{path} is {size} bytes, not {listed[path]['size']} "
                          "(truncated or altered)")
        if digest != listed[path]["sha256"]:
            raise refuse(source, f"{path} does not match its sha256 (altered or damaged)")
    entries = [FileEntry(path=str(e["path"]), size=int(e["size"]), sha256=str(e["sha256"]))
               for e in manifest["files"]]
    if sums is None or sums.decode(errors="replace") != sha256sums_text(entries) \
            or manifest.get("sha256sums") != listed.get(SUMS, {}).get("sha256"):
        raise refuse(source, f"{SUMS} disagrees with {MANIFEST}")


def verify(source: Path, *, pubkey: Path | None = None) -> VerifyResult:
    """Check a bundle folder or archive completely, without extracting anything."""
    if source.is_dir():
        return _verify_dir(source, pubkey)
    if source.is_file():
        return _verify_archive(source, pubkey)
    msg = f"{source} does not exist: pass a bundle folder or its .tar"
    raise BundleError(msg)


def _walk(folder: Path) -> list[str]:
    """Every regular file under ``folder``; any link, device or other node is refused."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            rel = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(mode):
                raise refuse(folder, f"{rel} is a link")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise refuse(folder, f"{rel} is a device, fifo or socket")
            if stat.S_ISREG(mode):
                found.append(rel)
    return sorted(found)


def _verify_dir(folder: Path, pubkey: Path | None) -> VerifyResult:
    paths = _walk(folder)
    if MANIFEST not in paths:
        raise refuse(folder, f"{MANIFEST} is missing")
    data = (folder / MANIFEST).read_bytes()
    manifest = parse_manifest(folder, data)
    signature = (folder / SIGNATURE).read_bytes() if SIGNATURE in paths else None
    state = check_signature(folder, data, signature, pubkey)
    listed = {str(e["path"]): int(e["size"]) for e in manifest["files"]}
    present = [p for p in paths if p not in UNSIGNED
               and (p in listed or not p.startswith(SITE_MODELS))]
    # Cheap checks first: missing, extra and truncated files before hashing gigabytes.
    sizes = {p: (folder / p).stat().st_size for p in present}
    _precheck(folder, listed, sizes)
    found = {p: (sizes[p], sha256_file(folder / p)) for p in present}
    sums = (folder / SUMS).read_bytes() if SUMS in paths else None
    compare_files(folder, manifest, found, sums)
    return VerifyResult(source=folder, kind="directory", manifest=manifest, signature=state,
                        files=len(found), bytes=sum(s for s, _ in found.values()))


def _precheck(source: Path, listed: Mapping[str, int], sizes: Mapping[str, int]) -> None:
    for path in sorted(listed):
        if path not in sizes:
            raise refuse(source, f"{path} is missing")
    for path in sorted(sizes):
        if path not in listed:
            raise refuse(source, f"{path} is not in the manifest (an extra file)")
        if sizes[path] != listed[path]:
            raise refuse(source, f"{path} is {sizes[path]} bytes, not {listed[path]} "
                          "(truncated or altered)")


class _ArchiveScan:
    """One streaming pass over a bundle archive: every member checked, hashed, never written."""

    def __init__(self, source: Path, pubkey: Path | None) -> None:
        self.source = source
        self.pubkey = pubkey
        self.top = ""
        self.seen: set[str] = set()
        self.manifest_data: bytes | None = None
        self.manifest: dict[str, Any] | None = None
        self.signature: bytes | None = None
        self.sums: bytes | None = None
        self.found: dict[str, tuple[int, str]] = {}

    def member(self, tar: tarfile.TarFile, info: tarfile.TarInfo) -> None:
        if not self.top:
            self.top = PurePosixPath(info.name).parts[0] if info.name else ""
            if not self.top or self.top in (".", "..") or info.name.startswith("/"):
                raise refuse(self.source, f"member {info.name!r} is not under one bundle folder")
        problem = member_problem(info, self.top)
        if problem:
            raise refuse(self.source, problem)
        if info.isdir():
            return
        rel = info.name[len(self.top) + 1:]
        if rel in self.seen:
            raise refuse(self.source, f"{rel} appears twice in the archive")
        self.seen.add(rel)
        if self.manifest is not None and rel not in self.listed and rel not in UNSIGNED:
            raise refuse(self.source, f"{rel} is not in the manifest (an extra file)")
        handle = tar.extractfile(info)
        assert handle is not None
        if rel in UNSIGNED:
            self._small(rel, handle.read(MAX_MANIFEST_BYTES + 1))
            return
        digest, size = hashlib.sha256(), 0
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if rel == SUMS:
                self.sums = (self.sums or b"") + chunk
        self.found[rel] = (size, digest.hexdigest())

    @property
    def listed(self) -> set[str]:
        assert self.manifest is not None
        return {str(e["path"]) for e in self.manifest["files"]}

    def _small(self, rel: str, data: bytes) -> None:
        if len(data) > MAX_MANIFEST_BYTES:
            raise refuse(self.source, f"{rel} is larger than {MAX_MANIFEST_BYTES} bytes")
        if rel == SIGNATURE:
            self.signature = data
            return
        self.manifest_data = data
        self.manifest = parse_manifest(self.source, data)

    def finish(self) -> VerifyResult:
        if self.manifest is None or self.manifest_data is None:
            raise refuse(self.source, f"{MANIFEST} is missing")
        state = check_signature(self.source, self.manifest_data, self.signature, self.pubkey)
        compare_files(self.source, self.manifest, self.found, self.sums)
        return VerifyResult(source=self.source, kind="archive", manifest=self.manifest,
                            signature=state, files=len(self.found),
                            bytes=sum(s for s, _ in self.found.values()))


def _verify_archive(source: Path, pubkey: Path | None) -> VerifyResult:
    scan = _ArchiveScan(source, pubkey)
    try:
        with source.open("rb") as handle, tarfile.open(fileobj=handle, mode="r|") as tar:
            for info in tar:
                scan.member(tar, info)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise refuse(source, f"the archive is unreadable or truncated ({exc})") from None
    return scan.finish()


# --- inspect and load -------------------------------------------------------------------


def read_manifest(source: Path) -> dict[str, Any]:
    """The manifest of a folder or archive (for inspect; no file is checked)."""
    if source.is_dir():
        path = source / MANIFEST
        if not path.is_file() or path.is_symlink():
            raise refuse(source, f"{MANIFEST} is missing")
        return parse_manifest(source, path.read_bytes())
    try:
        with source.open("rb") as handle, tarfile.open(fileobj=handle, mode="r|") as tar:
            for info in tar:
                if info.isreg() and PurePosixPath(info.name).parts[1:] == (MANIFEST,):
                    extracted = tar.extractfile(info)
                    assert extracted is not None
                    return parse_manifest(source, extracted.read(MAX_MANIFEST_BYTES))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise refuse(source, f"the archive is unreadable ({exc})") from None
    raise refuse(source, f"{MANIFEST} is missing")


