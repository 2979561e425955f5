"""Offline bundles for air-gapped sites: export, inspect, verify, load.

A bundle is a directory (optionally packed into one ``.tar``)::

    manifest.json      format version, inputs, images, size + sha256 of every other file
    manifest.sig       ed25519 over the exact bytes of manifest.json (optional)
    SHA256SUMS         the same checksums in ``sha256sum -c`` form, for the site scripts
    images.tar.zst     ONE ``docker save`` stream of every image (shared layers stored once)
    sbom/ dockerfiles/ locks/ reports/ [wheels/] bin/ README.md

Export streams the daemon's save archive through zstd into the file, hashing the
compressed bytes in the same pass: no uncompressed tar touches the disk. Everything is
written into a hidden staging folder beside the target and renamed at the end, so a
killed export leaves nothing at the target and a rerun starts clean.

Verification streams and never extracts: a folder is walked (links, devices and unknown
files refused), an archive is read member by member against an allow-list (regular files
and folders under one top folder; absolute paths, ``..``, links and devices refused).
Nothing reaches Docker before every check has passed.

Determinism (issue 7, item 4): the same images and options give the same bytes. The
save stream's member order is the daemon's lexical walk; its ``manifest.json`` lists
images in Go map order, so it is rewritten sorted. zstd runs multi-threaded at a pinned
level; zstd's multi-threaded format does not depend on the worker count (checked:
threads 1, 2, 4, 8 give identical frames). File order, modes and the archive's headers
are fixed; the only time is ``created``, from the cells' SOURCE_DATE_EPOCH.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, Any, BinaryIO, Literal

import jinja2
import zstandard

from stackpin import __version__, provenance, sbom, signing
from stackpin.engine import Engine, ImageInfo, SaveRequest
from stackpin.errors import BundleError, ValidationError
from stackpin.lock import Lock, atomic_write
from stackpin.matrix import Cell, RunFlags, Variant, cell_to_dict
from stackpin.render import RenderRequest, base_reference, image_tags, render
from stackpin.wheelhouse import sha256_file

FORMAT = "stackpin-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
SUMS = "SHA256SUMS"
IMAGES = "images.tar.zst"
# Level 3 with workers: measured within the export-time budget (docs/benchmarks.md)
# and smaller than `zstd -T0 -3`. Pinned: the level is part of the bundle's bytes.
ZSTD_LEVEL = 3
DEFAULT_PORTS: Mapping[str, int] = {"enhanced": 18887, "stable": 18888}
MAX_MANIFEST_BYTES = 16 << 20
_CHUNK = 1 << 20
_UNSIGNED = (MANIFEST, SIGNATURE)  # every other file is listed in the manifest
_EXECUTABLE = re.compile(r"^bin/[^/]+\.sh$")
_PROFILE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")

LineSink = Callable[[str], None]
SignatureState = Literal["verified", "absent", "not checked"]


def _ignore(_line: str) -> None:
    """Default progress sink."""


# --- what goes in ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Selection:
    """One image to bundle: a cell, a variant and the lock it was built from."""

    cell: Cell
    variant: Variant
    lock: Lock


@dataclass(frozen=True, kw_only=True)
class ExportRequest:
    selections: tuple[Selection, ...]
    out_dir: Path
    root: Path  # the project: templates/, bundle/, build/reports/, wheels/
    archive: bool = False
    sign_key: Path | None = None
    with_wheels: bool = False
    force: bool = False
    zstd_threads: int = -1  # -1: one worker per CPU; the bytes do not depend on it


@dataclass(frozen=True, kw_only=True)
class BundleImage:
    """An image as the manifest records it (and the site scripts use it)."""

    cell: str
    variant: str
    profile: str
    port: int
    platform: str
    cpu_arch: str
    arch: tuple[str, ...]
    id: str
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    run: Mapping[str, Any]
    size: int

    @property
    def name(self) -> str:
        return f"{self.cell}-{self.variant}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["tags"] = list(self.tags)
        data["arch"] = list(self.arch)
        data["labels"] = dict(sorted(self.labels.items()))
        data["sbom"] = f"sbom/{self.name}.cdx.json"
        return data


@dataclass(frozen=True, kw_only=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class StreamStats:
    tar_bytes: int
    bytes: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    out_dir: Path
    archive: Path | None
    manifest_sha256: str
    images: tuple[BundleImage, ...]
    stream: StreamStats
    signed_by: str | None


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


# --- pure pieces ------------------------------------------------------------------------


def assign_profiles(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, int]]:
    """Profile name and loopback port per (cell, variant), in order.

    A variant bundled for one cell is its own profile (``stable`` on 18888, ``enhanced``
    on 18887, as in the field); when several cells bring the same variant the profile is
    ``<cell>.<variant>`` and each further cell's ports sit 2 below the previous cell's.
    """
    counts: dict[str, int] = {}
    for _cell, variant in pairs:
        counts[variant] = counts.get(variant, 0) + 1
    cell_order = list(dict.fromkeys(cell for cell, _ in pairs))
    result = []
    for cell, variant in pairs:
        name = variant if counts[variant] == 1 else f"{cell}.{variant}"
        port = DEFAULT_PORTS.get(variant, 18889) - 2 * cell_order.index(cell)
        result.append((name, port))
    return result


def run_flags_json(flags: RunFlags) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(flags).items()}


def docker_run_args(run: Mapping[str, Any]) -> list[str]:
    """``docker run`` options for a cell's run flags (what the site scripts pass)."""
    args = [f"--device={d}" for d in run.get("devices", ())]
    args += [f"--group-add={g}" for g in run.get("group_add", ())]
    args += [f"--volume={v}" for v in run.get("volumes", ())]
    args += [f"--cap-add={c}" for c in run.get("cap_add", ())]
    args += [f"--security-opt={s}" for s in run.get("security_opt", ())]
    for key, option in (("shm_size", "--shm-size"), ("gpus", "--gpus"), ("ipc", "--ipc")):
        if run.get(key):
            args.append(f"{option}={run[key]}")
    return args


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def created_epoch(selections: Sequence[Selection]) -> int:
    """The bundle's only timestamp: the newest SOURCE_DATE_EPOCH of its cells."""
    return max(s.cell.source_date_epoch for s in selections)


def sha256sums_text(entries: Iterable[FileEntry]) -> str:
    """``sha256sum -c`` input for every listed file except SHA256SUMS itself."""
    return "".join(f"{e.sha256}  {e.path}\n" for e in sorted(entries, key=lambda e: e.path)
                   if e.path != SUMS)


def build_manifest(
    *,
    selections: Sequence[Selection],
    images: Sequence[BundleImage],
    files: Sequence[FileEntry],
    stream: StreamStats,
    layout_version: str,
    with_wheels: bool,
    signed_by: str | None,
) -> dict[str, Any]:
    """The manifest document (pure); ``files`` must include SHA256SUMS."""
    by_path = {f.path: f for f in files}
    if SUMS not in by_path or IMAGES not in by_path:
        msg = f"internal: the manifest needs {SUMS} and {IMAGES} among the files"
        raise BundleError(msg)
    epoch = created_epoch(selections)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "layout_version": layout_version,
        "created": rfc3339(epoch),
        "source_date_epoch": epoch,
        "stackpin_version": __version__,
        "signed_by": signed_by,
        "inputs": {
            "cells": sorted({s.cell.id for s in selections}),
            "variants": [f"{s.cell.id}:{s.variant}" for s in selections],
            "locks": {s.cell.id: s.lock.digest for s in selections},
            "with_wheels": with_wheels,
        },
        "images_archive": {
            "path": IMAGES,
            "compression": "zstd",
            "level": ZSTD_LEVEL,
            "tar_bytes": stream.tar_bytes,
            # docker load stages the archive, then unpacks its layers: about this much.
            "unpacked_bytes": stream.tar_bytes,
        },
        "images": [i.to_json() for i in images],
        "files": [asdict(by_path[p]) for p in sorted(by_path)],
        "sha256sums": by_path[SUMS].sha256,
    }


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """Canonical bytes: sorted keys, two-space indent (the site scripts read one line)."""
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def shell_assign(name: str, value: str | int | Sequence[str]) -> str:
    if isinstance(value, (str, int)):
        return f"{name}={shlex.quote(str(value))}\n"
    return f"{name}=({' '.join(shlex.quote(v) for v in value)})\n"


def bundle_conf(images: Sequence[BundleImage], stream: StreamStats) -> str:
    """bin/bundle.conf: bundle-wide data for the site scripts (sourced after checksums)."""
    text = "# Generated by stackpin bundle export; data only, sourced by bin/*.sh.\n"
    text += shell_assign("BUNDLE_FORMAT_VERSION", FORMAT_VERSION)
    text += shell_assign("BUNDLE_UNPACKED_BYTES", stream.tar_bytes)
    text += shell_assign("BUNDLE_PROFILES", [i.profile for i in images])
    text += shell_assign("BUNDLE_IMAGE_IDS", [i.id for i in images])
    text += shell_assign("BUNDLE_PLATFORMS", sorted({i.platform for i in images}))
    text += shell_assign("BUNDLE_CPU_ARCHES", sorted({i.cpu_arch for i in images}))
    text += shell_assign("BUNDLE_ARCHES", sorted({a for i in images for a in i.arch}))
    devices = sorted({d.split(":")[0] for i in images for d in i.run.get("devices", ())})
    text += shell_assign("BUNDLE_DEVICES", devices)
    volumes = sorted({v.split(":")[0] for i in images for v in i.run.get("volumes", ())})
    text += shell_assign("BUNDLE_HOST_PATHS", volumes)
    shm = sorted({str(i.run.get("shm_size") or "") for i in images} - {""})
    text += shell_assign("BUNDLE_SHM_SIZES", shm)
    return text


def profile_conf(image: BundleImage) -> str:
    """bin/profiles/<profile>.conf: one image's run settings."""
    text = f"# Generated by stackpin bundle export: profile {image.profile}; data only.\n"
    text += shell_assign("PROFILE_NAME", image.profile)
    text += shell_assign("PROFILE_CELL", image.cell)
    text += shell_assign("PROFILE_VARIANT", image.variant)
    text += shell_assign("PROFILE_PLATFORM", image.platform)
    text += shell_assign("PROFILE_IMAGE_ID", image.id)
    text += shell_assign("PROFILE_IMAGE_TAG", image.tags[0])
    text += shell_assign("PROFILE_PORT", image.port)
    text += shell_assign("PROFILE_RUN_ARGS", docker_run_args(image.run))
    return text


def render_readme(template_dir: Path, manifest_like: Mapping[str, Any]) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    return env.get_template("README.md.j2").render(manifest_like)


# --- secrets ----------------------------------------------------------------------------

_SECRET_TEXT: tuple[tuple[str, re.Pattern[bytes]], ...] = (
    ("a private key", re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("an AWS access key", re.compile(rb"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(rb"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_\w{22,})")),
    ("a Hugging Face token", re.compile(rb"\bhf_[A-Za-z0-9]{30,}\b")),
    ("a Slack token", re.compile(rb"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a password or token assignment", re.compile(
        rb"(?i)\b(?:password|passwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)\b"
        rb"[\"']?\s*[:=]\s*[\"']?[^\s\"'$]{4,}")),
    ("credentials in a URL", re.compile(rb"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
)
_SECRET_NAME = re.compile(
    r"(?:^|[_.-])(?:PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
    r"|CREDENTIALS?|AUTH)(?:$|[_.-])",
    re.IGNORECASE,
)


def find_secret(data: bytes) -> str | None:
    """What kind of secret ``data`` holds (never the secret itself), or None."""
    for kind, pattern in _SECRET_TEXT:
        if pattern.search(data):
            return kind
    return None


def scan_image_config(info: ImageInfo, *, name: str) -> None:
    """Refuse an image whose environment or labels carry a secret."""
    items = [("environment variable", *e.partition("=")[::2]) for e in info.env]
    items += [("label", k, v) for k, v in info.labels.items()]
    for where, key, value in items:
        kind = find_secret(f"{key}={value}".encode())
        if value and _SECRET_NAME.search(key):
            kind = kind or "a credential-named setting"
        if kind:
            msg = (
                f"image {name}: {where} {key} holds {kind}; a bundle never carries secrets: "
                "pass it at run time instead, rebuild, and export again"
            )
            raise BundleError(msg)


def scan_files(folder: Path, paths: Iterable[str]) -> None:
    """Refuse when a bundle file (images and wheels aside: binary) holds a secret."""
    for rel in paths:
        if rel == IMAGES or rel.endswith(".whl"):
            continue
        kind = find_secret((folder / rel).read_bytes())
        if kind:
            msg = (
                f"{rel} holds {kind}; a bundle never carries secrets: remove it from its "
                "source (build/reports/, the lock, the matrix) and export again"
            )
            raise BundleError(msg)


# --- the save stream: normalised, compressed and hashed in one pass -------------------


class _Chunks:
    """Exact reads and zero-copy pass-through over an iterator of byte chunks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def _fill(self) -> bool:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            self._pending = memoryview(chunk)
        return True

    def read(self, size: int) -> bytes:
        """Exactly ``size`` bytes, or fewer only at the end of the stream."""
        parts = []
        while size and self._fill():
            part = self._pending[:size]
            self._pending = self._pending[len(part):]
            parts.append(bytes(part))
            size -= len(part)
        return b"".join(parts)

    def copy(self, size: int, sink: IO[bytes] | io.RawIOBase) -> None:
        while size:
            if not self._fill():
                msg = "the Docker daemon ended the save stream early; export again"
                raise BundleError(msg)
            part = self._pending[:size]
            self._pending = self._pending[len(part):]
            sink.write(part)
            size -= len(part)

    def rest(self, sink: IO[bytes] | io.RawIOBase) -> None:
        while self._fill():
            sink.write(self._pending)
            self._pending = memoryview(b"")


class CompressingSink(io.RawIOBase):
    """Writes zstd frames of what it is given to ``out``, hashing the compressed bytes."""

    def __init__(self, out: BinaryIO, *, level: int = ZSTD_LEVEL, threads: int = -1) -> None:
        # threads >= 1 selects zstd's multi-threaded format, whose bytes do not depend on
        # the number of workers; threads=0 is a different (single-threaded) framing.
        workers = threads if threads >= 1 else max(os.cpu_count() or 1, 1)
        params = zstandard.ZstdCompressionParameters.from_level(
            level, threads=workers, write_checksum=True
        )
        self._compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
        self._out = out
        self._sha = hashlib.sha256()
        self.raw_bytes = 0
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.raw_bytes += len(view)
        self._emit(self._compressor.compress(view))
        return len(view)

    def finish(self) -> StreamStats:
        self._emit(self._compressor.flush())
        return StreamStats(tar_bytes=self.raw_bytes, bytes=self.bytes,
                           sha256=self._sha.hexdigest())

    def _emit(self, data: bytes) -> None:
        if data:
            self._sha.update(data)
            self._out.write(data)
            self.bytes += len(data)


def sorted_save_manifest(data: bytes) -> bytes:
    """The save archive's manifest.json with its entries and tags in a fixed order."""
    entries = json.loads(data)
    for entry in entries:
        entry["RepoTags"] = sorted(entry.get("RepoTags") or [])
    entries.sort(key=lambda e: (e.get("Config", ""), e["RepoTags"]))
    return json.dumps(entries, separators=(",", ":")).encode() + b"\n"


def _tar_size(field: bytes) -> int:
    if field[0] & 0x80:  # base-256, for members of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    return int(field.rstrip(b"\0 ").strip() or b"0", 8)


def _tar_header_with_size(header: bytes, size: int) -> bytes:
    block = bytearray(header)
    block[124:136] = b"%011o\0" % size
    block[148:156] = b" " * 8  # the checksum counts its own field as spaces
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def normalize_save_stream(chunks: Iterable[bytes], sink: IO[bytes] | io.RawIOBase) -> None:
    """Copy a ``docker save`` tar to ``sink``, fixing its one unordered file.

    Headers and data pass through byte for byte (zero-copy: this runs at the daemon's
    speed), except the top-level ``manifest.json``, whose entries are sorted and whose
    header gets the new size and checksum.
    """
    stream = _Chunks(chunks)
    while True:
        header = stream.read(512)
        if len(header) < 512:
            msg = "the Docker daemon ended the save stream early; export again"
            raise BundleError(msg)
        if header == bytes(512):  # end of archive: the rest is zero padding
            sink.write(header)
            stream.rest(sink)
            return
        size = _tar_size(header[124:136])
        padded = -(-size // 512) * 512
        is_manifest = (header[0:100].rstrip(b"\0") == b"manifest.json"
                       and header[156:157] in (b"0", b"\0") and not header[345:500].strip(b"\0"))
        if not is_manifest:
            sink.write(header)
            stream.copy(padded, sink)
            continue
        body = sorted_save_manifest(stream.read(size))
        stream.read(padded - size)
        sink.write(_tar_header_with_size(header, len(body)))
        sink.write(body + bytes(-len(body) % 512))


def write_images(engine: Engine, names: Sequence[str], path: Path, *, threads: int) -> StreamStats:
    with path.open("wb") as out:
        sink = CompressingSink(out, threads=threads)
        normalize_save_stream(engine.save(SaveRequest(images=tuple(sorted(names)))), sink)
        stats = sink.finish()
        out.flush()
        os.fsync(out.fileno())
    return stats


# --- export -----------------------------------------------------------------------------


def resolve_images(engine: Engine, selections: Sequence[Selection]) -> list[BundleImage]:
    """The built image of every selection, checked against its lock; secrets refused."""
    profiles = assign_profiles([(s.cell.id, s.variant) for s in selections])
    images = []
    for selection, (profile, port) in zip(selections, profiles, strict=True):
        cell, variant, lock = selection.cell, selection.variant, selection.lock
        tags = image_tags(cell, variant, lock.digest)
        info = engine.image_info(tags[0])
        if info is None:
            msg = (
                f"no image {tags[0]} (cell {cell.id}, variant {variant}, lock "
                f"{lock.digest[:12]}): build it first with `stackpin build {cell.id} "
                f"--variant {variant}`"
            )
            raise BundleError(msg)
        if info.labels.get("io.stackpin.lock-digest") != lock.digest:
            msg = (
                f"{tags[0]} carries lock digest {info.labels.get('io.stackpin.lock-digest')!r}, "
                f"not {lock.digest}: rebuild it with `stackpin build {cell.id}`"
            )
            raise BundleError(msg)
        scan_image_config(info, name=tags[0])
        images.append(BundleImage(
            cell=cell.id, variant=variant, profile=profile, port=port,
            platform=cell.platform, cpu_arch=cell.cpu_arch, arch=cell.arch, id=info.id,
            # The moving tag travels only when it still names this very image.
            tags=tuple(t for t in tags if t in info.tags or t == tags[0]),
            labels=dict(info.labels), run=run_flags_json(cell.run), size=info.size,
        ))
    return images


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_dir(out_dir: Path) -> Path:
    """A fresh hidden folder beside ``out_dir``; partial ones of dead exports are removed."""
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(rf"^\.{re.escape(out_dir.name)}\.(?:partial|old)-(\d+)$")
    for stale in parent.iterdir():
        match = pattern.match(stale.name)
        if match and (int(match.group(1)) == os.getpid() or not _pid_alive(int(match.group(1)))):
            shutil.rmtree(stale, ignore_errors=True)
    path = parent / f".{out_dir.name}.partial-{os.getpid()}"
    path.mkdir()
    return path


def _put(folder: Path, rel: str, data: bytes) -> None:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o755 if _EXECUTABLE.match(rel) else 0o644)


def _copy(folder: Path, rel: str, source: Path) -> None:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path)
    path.chmod(0o755 if _EXECUTABLE.match(rel) else 0o644)


def _listing(folder: Path) -> list[str]:
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()
    )


def write_static_files(request: ExportRequest, staging: Path, images: Sequence[BundleImage],
                       stream: StreamStats) -> None:
    """Everything but the images, the SBOMs and the manifest: pure copies and renders."""
    skeleton = request.root / "bundle"
    for script in sorted((skeleton / "bin").glob("*.sh")):
        _copy(staging, f"bin/{script.name}", script)
    _put(staging, "bin/bundle.conf", bundle_conf(images, stream).encode())
    for image in images:
        _put(staging, f"bin/profiles/{image.profile}.conf", profile_conf(image).encode())
    for selection in request.selections:
        cell, variant, lock = selection.cell, selection.variant, selection.lock
        _put(staging, f"dockerfiles/{cell.id}-{variant}.Dockerfile",
             _dockerfile(request, selection).encode())
        _put(staging, f"locks/{cell.id}.lock", lock.text().encode())
        _put(staging, f"locks/{cell.id}.cell.json",
             (json.dumps(cell_to_dict(cell), indent=2, sort_keys=True) + "\n").encode())
        if request.with_wheels:
            _copy_wheels(request.root, staging, lock)
    reports = request.root / "build" / "reports"
    if reports.is_dir():
        for source in sorted(reports.rglob("*")):
            if source.is_file() and not source.is_symlink():
                _copy(staging, f"reports/{source.relative_to(reports).as_posix()}", source)


def _copy_wheels(root: Path, staging: Path, lock: Lock) -> None:
    from stackpin.wheelhouse import locate

    for wheel in lock.wheels:
        rel = f"wheels/{lock.cell}/{wheel.filename}"
        _copy(staging, rel, locate(root, lock.cell, wheel.filename))
        if sha256_file(staging / rel) != wheel.sha256:
            msg = (
                f"{wheel.filename} does not hash to its lock entry: the wheelhouse changed; "
                f"run `stackpin wheels fetch {lock.cell}` and rebuild before exporting"
            )
            raise BundleError(msg)


def write_sboms(engine: Engine, staging: Path, images: Sequence[BundleImage],
                created: str) -> None:
    for image in images:
        result = engine.run_to_completion(sbom.probe_request(image.id), timeout_s=600)
        if result.exit_code != 0:
            msg = (
                f"cannot list the packages of {image.tags[0]} (exit {result.exit_code}): "
                f"{result.logs.strip()[-200:]}; run it by hand to see why"
            )
            raise BundleError(msg)
        inventory = sbom.parse_probe(result.stdout, image=image.tags[0])
        subject = sbom.Subject(image_id=image.id, tag=image.tags[0], created=created)
        _put(staging, f"sbom/{image.name}.cdx.json",
             sbom.sbom_bytes(sbom.cyclonedx(inventory, subject)))


def _dockerfile(request: ExportRequest, selection: Selection) -> str:
    return render(RenderRequest(
        cell=selection.cell, variant=selection.variant, lock=selection.lock,
        templates_dir=request.root / "templates", stackpin_version=__version__,
    )).dockerfile


def _base_image_id(engine: Engine, cell: Cell, labels: Mapping[str, str]) -> str:
    info = engine.image_info(base_reference(cell))
    if info is not None:
        return info.id
    pinned = labels.get("org.opencontainers.image.base.digest", "")
    if pinned:
        return pinned
    msg = (
        f"base {base_reference(cell)} of {cell.id} is not on this daemon and the image does "
        "not record its digest: load or rebuild the base so the provenance can name it"
    )
    raise BundleError(msg)


def write_provenance(engine: Engine, request: ExportRequest, staging: Path,
                     images: Sequence[BundleImage]) -> None:
    """provenance/<cell>.intoto.json: an in-toto / SLSA v1 statement per cell (issue 7).

    Listed in the manifest like every file, so the manifest signature covers it.
    """
    for cell_id in dict.fromkeys(s.cell.id for s in request.selections):
        pairs = [(s, i) for s, i in zip(request.selections, images, strict=True)
                 if s.cell.id == cell_id]
        first_selection, first_image = pairs[0]
        labels = first_image.labels
        inputs = provenance.ProvenanceInputs(
            lock=first_selection.lock,
            base_reference=base_reference(first_selection.cell),
            base_image_id=_base_image_id(engine, first_selection.cell, labels),
            dockerfiles={s.variant: _dockerfile(request, s) for s, _ in pairs},
            stackpin_version=labels.get("io.stackpin.version", __version__),
            source_commit=labels.get("io.stackpin.source-commit", "unknown"),
        )
        subjects = [provenance.ImageSubject(name=i.tags[0], image_id=i.id) for _, i in pairs]
        try:
            statement = provenance.provenance_statement(inputs, subjects)
        except ValidationError as exc:
            msg = f"cannot state the provenance of {cell_id}: {exc.message}"
            raise BundleError(msg) from None
        _put(staging, f"provenance/{cell_id}.intoto.json", provenance.statement_bytes(statement))


def finish_bundle(request: ExportRequest, staging: Path, images: Sequence[BundleImage],
                  stream: StreamStats, *, signed_by: str | None) -> bytes:
    """README, SHA256SUMS and manifest over what is in ``staging``; returns the manifest."""
    layout = (request.root / "bundle" / "LAYOUT_VERSION").read_text(encoding="utf-8").strip()
    partial = {
        "created": rfc3339(created_epoch(request.selections)),
        "images": [i.to_json() for i in images],
        "signed_by": signed_by,
        "stackpin_version": __version__,
        "layout_version": layout,
        "with_wheels": request.with_wheels,
    }
    _put(staging, "README.md", render_readme(request.root / "bundle", partial).encode())
    listed = [p for p in _listing(staging) if p not in (*_UNSIGNED, SUMS)]
    scan_files(staging, listed)
    entries = [
        FileEntry(path=p, size=(staging / p).stat().st_size,
                  sha256=stream.sha256 if p == IMAGES else sha256_file(staging / p))
        for p in listed
    ]
    _put(staging, SUMS, sha256sums_text(entries).encode())
    entries.append(FileEntry(path=SUMS, size=(staging / SUMS).stat().st_size,
                             sha256=sha256_file(staging / SUMS)))
    manifest = build_manifest(
        selections=request.selections, images=images, files=entries, stream=stream,
        layout_version=layout, with_wheels=request.with_wheels, signed_by=signed_by,
    )
    data = manifest_bytes(manifest)
    _put(staging, MANIFEST, data)
    return data


def export(engine: Engine, request: ExportRequest, *, on_line: LineSink = _ignore) -> ExportResult:
    """Write the bundle at ``request.out_dir`` (and ``<out_dir>.tar`` with ``archive``)."""
    out_dir = request.out_dir
    archive = out_dir.with_name(out_dir.name + ".tar") if request.archive else None
    for target in (out_dir, archive):
        if target is not None and target.exists() and not request.force:
            msg = f"{target} exists: choose another -o or pass --force to replace it"
            raise BundleError(msg)
    key = signing.load_private(request.sign_key) if request.sign_key else None
    signed_by = signing.fingerprint(key.public_key()) if key else None
    images = resolve_images(engine, request.selections)
    staging = staging_dir(out_dir)
    try:
        names = sorted({t for i in images for t in i.tags})
        on_line(f"bundle: saving {len(images)} image(s) as one stream: {', '.join(names)}")
        stream = write_images(engine, names, staging / IMAGES, threads=request.zstd_threads)
        (staging / IMAGES).chmod(0o644)
        on_line(f"bundle: {IMAGES}: {stream.tar_bytes} -> {stream.bytes} bytes")
        created = rfc3339(created_epoch(request.selections))
        on_line("bundle: reading package inventories (SBOM) from the images")
        write_sboms(engine, staging, images, created)
        write_provenance(engine, request, staging, images)
        write_static_files(request, staging, images, stream)
        data = finish_bundle(request, staging, images, stream, signed_by=signed_by)
        if key is not None:
            _put(staging, SIGNATURE, signing.sign(data, key))
        _swap_into_place(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if archive is not None:
        on_line(f"bundle: packing {archive}")
        with atomic_write(archive) as tmp:
            pack_archive(out_dir, tmp, mtime=created_epoch(request.selections))
    return ExportResult(out_dir=out_dir, archive=archive,
                        manifest_sha256=hashlib.sha256(data).hexdigest(), images=tuple(images),
                        stream=stream, signed_by=signed_by)


def _swap_into_place(staging: Path, out_dir: Path) -> None:
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    if out_dir.exists():
        out_dir.rename(old)
    staging.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def pack_archive(folder: Path, target: Path, *, mtime: int) -> None:
    """One uncompressed tar of the bundle (its big file is compressed already).

    Fixed order (manifest first, so a streaming reader can check each member as it
    comes), owner 0/0 without names, fixed modes and mtimes: same folder, same bytes.
    """
    top = folder.name
    files = _listing(folder)
    first = [p for p in (MANIFEST, SIGNATURE) if p in files]
    ordered = first + [p for p in files if p not in first]
    dirs = sorted({str(parent) for p in ordered for parent in PurePosixPath(p).parents} - {"."})
    with target.open("wb") as out, tarfile.open(fileobj=out, mode="w",
                                                format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tar_dir(top, mtime))
        for rel in dirs:
            tar.addfile(_tar_dir(f"{top}/{rel}", mtime))
        for rel in ordered:
            path = folder / rel
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = path.stat().st_size
            info.mode = 0o755 if _EXECUTABLE.match(rel) else 0o644
            info.mtime = mtime
            with path.open("rb") as handle:
                tar.addfile(info, handle)


def _tar_dir(name: str, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = mtime
    return info


# --- verification -----------------------------------------------------------------------


def _refuse(source: Path, reason: str) -> BundleError:
    return BundleError(
        f"{source}: {reason}; nothing was loaded: get a fresh copy of the bundle from the "
        "build host"
    )


def safe_relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return (bool(parts) and not path.startswith("/") and ".." not in parts and "." not in parts
            and "\\" not in path and str(PurePosixPath(*parts)) == path)


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
        raise _refuse(source, f"{MANIFEST} is not a stackpin bundle manifest")
    if manifest["format_version"] != FORMAT_VERSION:
        msg = (
            f"{source}: bundle format {manifest['format_version']} is not {FORMAT_VERSION}; "
            "use the stackpin version that wrote it"
        )
        raise BundleError(msg)
    for entry in manifest["files"]:
        if not safe_relative(str(entry.get("path", ""))) or entry["path"] in _UNSIGNED:
            raise _refuse(source, f"{MANIFEST} lists an unsafe path {entry.get('path')!r}")
    return manifest


def check_signature(source: Path, data: bytes, signature: bytes | None,
                    pubkey: Path | None) -> SignatureState:
    if pubkey is None:
        return "not checked" if signature is not None else "absent"
    if signature is None:
        raise _refuse(source, f"{SIGNATURE} is missing but a public key was given")
    signing.verify(data, signature, signing.load_public(pubkey), what=str(source))
    return "verified"


def compare_files(source: Path, manifest: Mapping[str, Any],
                  found: Mapping[str, tuple[int, str]], sums: bytes | None) -> None:
    """Every listed file present with its size and hash; nothing else; SHA256SUMS agrees."""
    listed = {str(e["path"]): e for e in manifest["files"]}
    for path in sorted(listed):
        if path not in found:
            raise _refuse(source, f"{path} is missing")
    for path in sorted(found):
        if path not in listed:
            raise _refuse(source, f"{path} is not in the manifest (an extra file)")
    for path in sorted(listed):
        size, digest = found[path]
        if size != listed[path]["size"]:
            raise _refuse(source, f"{path} is {size} bytes, not {listed[path]['size']} "
                          "(truncated or altered)")
        if digest != listed[path]["sha256"]:
            raise _refuse(source, f"{path} does not match its sha256 (altered or damaged)")
    entries = [FileEntry(path=str(e["path"]), size=int(e["size"]), sha256=str(e["sha256"]))
               for e in manifest["files"]]
    if sums is None or sums.decode(errors="replace") != sha256sums_text(entries) \
            or manifest.get("sha256sums") != listed.get(SUMS, {}).get("sha256"):
        raise _refuse(source, f"{SUMS} disagrees with {MANIFEST}")


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
                raise _refuse(folder, f"{rel} is a link")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise _refuse(folder, f"{rel} is a device, fifo or socket")
            if stat.S_ISREG(mode):
                found.append(rel)
    return sorted(found)


def _verify_dir(folder: Path, pubkey: Path | None) -> VerifyResult:
    paths = _walk(folder)
    if MANIFEST not in paths:
        raise _refuse(folder, f"{MANIFEST} is missing")
    data = (folder / MANIFEST).read_bytes()
    manifest = parse_manifest(folder, data)
    signature = (folder / SIGNATURE).read_bytes() if SIGNATURE in paths else None
    state = check_signature(folder, data, signature, pubkey)
    listed = {str(e["path"]): int(e["size"]) for e in manifest["files"]}
    present = [p for p in paths if p not in _UNSIGNED]
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
            raise _refuse(source, f"{path} is missing")
    for path in sorted(sizes):
        if path not in listed:
            raise _refuse(source, f"{path} is not in the manifest (an extra file)")
        if sizes[path] != listed[path]:
            raise _refuse(source, f"{path} is {sizes[path]} bytes, not {listed[path]} "
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
                raise _refuse(self.source, f"member {info.name!r} is not under one bundle folder")
        problem = member_problem(info, self.top)
        if problem:
            raise _refuse(self.source, problem)
        if info.isdir():
            return
        rel = info.name[len(self.top) + 1:]
        if rel in self.seen:
            raise _refuse(self.source, f"{rel} appears twice in the archive")
        self.seen.add(rel)
        if self.manifest is not None and rel not in self.listed and rel not in _UNSIGNED:
            raise _refuse(self.source, f"{rel} is not in the manifest (an extra file)")
        handle = tar.extractfile(info)
        assert handle is not None
        if rel in _UNSIGNED:
            self._small(rel, handle.read(MAX_MANIFEST_BYTES + 1))
            return
        digest, size = hashlib.sha256(), 0
        while chunk := handle.read(_CHUNK):
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
            raise _refuse(self.source, f"{rel} is larger than {MAX_MANIFEST_BYTES} bytes")
        if rel == SIGNATURE:
            self.signature = data
            return
        self.manifest_data = data
        self.manifest = parse_manifest(self.source, data)

    def finish(self) -> VerifyResult:
        if self.manifest is None or self.manifest_data is None:
            raise _refuse(self.source, f"{MANIFEST} is missing")
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
        raise _refuse(source, f"the archive is unreadable or truncated ({exc})") from None
    return scan.finish()


# --- inspect and load -------------------------------------------------------------------


def read_manifest(source: Path) -> dict[str, Any]:
    """The manifest of a folder or archive (for inspect; no file is checked)."""
    if source.is_dir():
        path = source / MANIFEST
        if not path.is_file() or path.is_symlink():
            raise _refuse(source, f"{MANIFEST} is missing")
        return parse_manifest(source, path.read_bytes())
    try:
        with source.open("rb") as handle, tarfile.open(fileobj=handle, mode="r|") as tar:
            for info in tar:
                if info.isreg() and PurePosixPath(info.name).parts[1:] == (MANIFEST,):
                    extracted = tar.extractfile(info)
                    assert extracted is not None
                    return parse_manifest(source, extracted.read(MAX_MANIFEST_BYTES))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise _refuse(source, f"the archive is unreadable ({exc})") from None
    raise _refuse(source, f"{MANIFEST} is missing")


@contextlib.contextmanager
def _images_stream(source: Path) -> Iterator[IO[bytes]]:
    if source.is_dir():
        with (source / IMAGES).open("rb") as handle:
            yield handle
        return
    with source.open("rb") as handle, tarfile.open(fileobj=handle, mode="r|") as tar:
        for info in tar:
            if info.isreg() and PurePosixPath(info.name).parts[1:] == (IMAGES,):
                extracted = tar.extractfile(info)
                assert extracted is not None
                yield extracted
                return
    raise _refuse(source, f"{IMAGES} is missing")


class _HashingChunks:
    """The decompressed chunks of a file, hashing the compressed bytes as they pass."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.sha = hashlib.sha256()

    def _compressed(self) -> Iterator[bytes]:
        while chunk := self._handle.read(_CHUNK):
            self.sha.update(chunk)
            yield chunk

    def __iter__(self) -> Iterator[bytes]:
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        for chunk in self._compressed():
            if out := decompressor.decompress(chunk):
                yield out


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    verified: VerifyResult
    image_ids: tuple[str, ...] = field(default_factory=tuple)


def load(engine: Engine, source: Path, *, pubkey: Path | None = None,
         on_line: LineSink = _ignore) -> LoadReport:
    """Verify everything, then stream the images into the daemon and check their IDs."""
    verified = verify(source, pubkey=pubkey)
    expected = str(next(e["sha256"] for e in verified.manifest["files"] if e["path"] == IMAGES))
    on_line(f"bundle: verified {verified.files} files ({verified.signature} signature); loading")
    with _images_stream(source) as handle:
        chunks = _HashingChunks(handle)
        engine.load(iter(chunks))
    wanted = tuple(str(i["id"]) for i in verified.manifest["images"])
    if chunks.sha.hexdigest() != expected:
        # Changed between the check and the load: take back what went in.
        for image_id in wanted:
            engine.remove_image(image_id, force=True)
        raise _refuse(source, f"{IMAGES} changed while it was being loaded")
    missing = [i for i in wanted if engine.image_info(i) is None]
    if missing:
        msg = f"{source}: after the load the daemon lacks {missing[0]}: check `docker images`"
        raise BundleError(msg)
    return LoadReport(verified=verified, image_ids=wanted)
