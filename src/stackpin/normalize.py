"""Normalise a built image so that its ID is a function of what the build installed.

Docker's classic builder writes the build time into every layer (file and directory
mtimes), into the config (``created``, every history ``created``, ``container``,
``container_config`` with the build container's hostname, the parent image ID in
``config.Image``) and the daemon version (``docker_version``); its layer tars list members
in walk order with ``root``/``root`` owner names. None of that is what the image *is*.

``normalize_image`` saves the image (one ``docker save`` stream), rewrites each layer tar
(``normalize_layer``: sorted members, mtimes clamped to the cell's SOURCE_DATE_EPOCH,
owner names dropped with numeric owners kept, PAX headers reduced to extended attributes,
volatile files such as ``/var/log/*`` removed, hard links kept valid, whiteouts kept),
recomputes the diff IDs, fixes the config (``normalize_config``) and loads the result
with the same tags. Layers taken from the base image are inputs pinned by digest and are
passed through byte for byte; a layer that is already normal comes out identical, so its
digest (and the daemon's copy of it) stays the same.

Everything streams through files in a temporary folder: a layer can hold 1.5 GB. The save
stream may be either layout (``stackpin.engine.save_format``); the normalised image is loaded
as an OCI layout, so its ID is known beforehand on both stores: the config digest on the
classic store, the manifest digest on the containerd image store.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from stackpin.bundle.delta import chain_ids, omitted_blobs
from stackpin.engine import Engine, SaveRequest, chunk_stream
from stackpin.engine.save_format import ImageLayout, image_layout
from stackpin.engine.save_unpack import SavedImage, unpack_save
from stackpin.errors import BuildError
from stackpin.normalize_record import normalize_config_only
from stackpin.primitives import CHUNK, HashingWriter, canonical_bytes, pid_alive, rfc3339
from stackpin.target import LABEL_SOURCE_DATE_EPOCH

# Bump when the rewrite rules change: cached raw -> normalised mappings then go stale.
NORMALIZE_VERSION = 1
SDE_LABEL = LABEL_SOURCE_DATE_EPOCH
# Config fields that describe the build run, not the image: the intermediate container's
# ID and config (its hostname is that ID) and the daemon's version.
VOLATILE_CONFIG_KEYS = ("container", "container_config", "docker_version")
# PAX records worth keeping: extended attributes (file capabilities such as ping's
# cap_net_raw live there). atime/ctime/mtime records are run-specific and dropped; path,
# linkpath, size and owners are re-derived from the header fields when written.
_KEPT_PAX_PREFIXES = ("SCHILY.xattr.", "LIBARCHIVE.xattr.")
_PYC_HEADER = 16
_WHITEOUT = ".wh."


def _ignore(_line: str) -> None:
    """Default progress sink."""


# --- member rules (pure) ---------------------------------------------------------------


def is_whiteout(name: str) -> bool:
    """An overlay deletion marker (``.wh.name`` or the opaque ``.wh..wh..opq``)."""
    return name.rpartition("/")[2].startswith(_WHITEOUT)


def volatile_reason(name: str, *, is_dir: bool) -> str | None:
    """Why a layer member is run-specific noise to drop, or None to keep it.

    Whiteouts are never dropped: removing one would resurrect a file of a lower layer.
    Directories are kept so packages that expect e.g. /var/log/apt still find it.
    """
    path = name.removeprefix("./").rstrip("/")
    if is_dir or is_whiteout(path):
        return None
    parts = path.split("/")
    if path.startswith("var/log/"):
        return "log file (timestamps of the build run)"
    if path == "var/cache/ldconfig/aux-cache":
        return "ldconfig's aux-cache (inode numbers and mtimes of the build host)"
    if path in ("var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin"):
        return "apt's binary package cache (rebuilt on demand)"
    if path.startswith(("var/lib/dpkg/", "var/cache/debconf/")) and path.endswith("-old"):
        return "dpkg/debconf backup of the previous state"
    for i in range(len(parts) - 1):
        if parts[i] == ".cache" and parts[i + 1] == "pip":
            return "pip cache"
    return None


def is_timestamp_pyc(name: str, header: bytes) -> bool:
    """A ``.pyc`` whose header validates by source mtime (PEP 552 flags field == 0).

    Such a file embeds the source mtime of the build run; hash-based pycs (what the
    build guard writes) are kept.
    """
    if not name.endswith(".pyc") or len(header) < _PYC_HEADER:
        return False
    return int.from_bytes(header[4:8], "little") == 0


def order_key(name: str) -> tuple[str, ...]:
    """Walk order: depth first, each folder's entries by name; a folder before its content."""
    return tuple(name.removeprefix("./").rstrip("/").split("/"))


def normalized_header(info: tarfile.TarInfo, *, source_date_epoch: int) -> tarfile.TarInfo:
    """A copy of a member header with the run-specific fields fixed."""
    out = copy.copy(info)
    out.mtime = min(int(info.mtime), source_date_epoch)
    # Numeric owners are what the file needs (a setgid tool of group 42 keeps it); the
    # names depend on the /etc/passwd of whatever wrote the tar.
    out.uname = out.gname = ""
    out.pax_headers = {
        k: v for k, v in sorted(info.pax_headers.items()) if k.startswith(_KEPT_PAX_PREFIXES)
    }
    return out


# --- one layer -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LayerStats:
    """What the rewrite of one layer did."""

    diff_id: str
    size: int
    members: int
    removed: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class _Planned:
    info: tarfile.TarInfo
    data_offset: int | None  # where the content is in the source tar; None: no content


def _last_by_name(members: Iterable[tarfile.TarInfo]) -> dict[str, tarfile.TarInfo]:
    # A name listed twice: extraction keeps the last one, so does the rewrite.
    found: dict[str, tarfile.TarInfo] = {}
    for member in members:
        found[member.name] = member
    return found


def _plan_layer(
    members: Mapping[str, tarfile.TarInfo], source: IO[bytes], *, source_date_epoch: int
) -> tuple[list[_Planned], list[str]]:
    removed: list[str] = []
    kept: dict[str, tarfile.TarInfo] = {}
    for name, member in members.items():
        reason = volatile_reason(name, is_dir=member.isdir())
        if reason is None and member.isfile() and name.endswith(".pyc"):
            source.seek(member.offset_data)
            if is_timestamp_pyc(name, source.read(_PYC_HEADER)):
                reason = "timestamp-based bytecode"
        if reason is None:
            kept[name] = member
        else:
            removed.append(name)
    # Hard links: the group (target + links) is rewritten so the first name in the new
    # order carries the content and the others link to it; a tar reader only resolves
    # links to members it has already seen.
    groups: dict[str, list[str]] = {}
    for name, member in kept.items():
        if member.islnk():
            groups.setdefault(member.linkname, [member.linkname]).append(name)
    data_of: dict[str, tuple[tarfile.TarInfo, str]] = {}
    for target, names in groups.items():
        holder = members.get(target)
        present = sorted((n for n in names if n in kept), key=order_key)
        if holder is None or not holder.isfile() or not present:
            continue  # a link to a lower layer: leave it as written
        first = present[0]
        for name in present:
            data_of[name] = (holder, first)
    planned: list[_Planned] = []
    for name in sorted(kept, key=order_key):
        info = normalized_header(kept[name], source_date_epoch=source_date_epoch)
        offset: int | None = kept[name].offset_data if kept[name].isfile() else None
        if name in data_of:
            holder, first = data_of[name]
            if name == first:
                info.type, info.linkname, info.size = tarfile.REGTYPE, "", holder.size
                offset = holder.offset_data
            else:
                info.type, info.linkname, info.size, offset = tarfile.LNKTYPE, first, 0, None
        planned.append(_Planned(info=info, data_offset=offset))
    return planned, sorted(removed, key=order_key)


def normalize_layer(source: IO[bytes], out: IO[bytes], *, source_date_epoch: int) -> LayerStats:
    """Rewrite one (seekable) layer tar into ``out``; pure apart from the two files.

    The same input always gives the same bytes, and a normal layer gives itself back.
    """
    try:
        with tarfile.open(fileobj=source, mode="r:") as tar:
            members = _last_by_name(tar.getmembers())
    except tarfile.TarError as exc:
        msg = f"cannot read a layer tar to normalise it ({exc}); rebuild with --no-normalize"
        raise BuildError(msg) from None
    planned, removed = _plan_layer(members, source, source_date_epoch=source_date_epoch)
    writer = HashingWriter(out)
    with tarfile.TarFile(
        fileobj=writer, mode="w", format=tarfile.PAX_FORMAT, copybufsize=CHUNK
    ) as tar:
        for item in planned:
            if item.data_offset is None:
                tar.addfile(item.info)
            else:
                source.seek(item.data_offset)
                tar.addfile(item.info, source)
    return LayerStats(
        diff_id=f"sha256:{writer.sha256.hexdigest()}",
        size=writer.size,
        members=len(planned),
        removed=tuple(removed),
    )


# --- the config (pure) ---------------------------------------------------------------


def source_date_epoch_of(labels: Mapping[str, str], image: str) -> int:
    """The SOURCE_DATE_EPOCH an image was built for, from its label."""
    value = str(labels.get(SDE_LABEL, ""))
    if not value.isdigit():
        msg = (
            f"image {image} has no {SDE_LABEL} label, so its timestamps cannot be fixed; "
            "build it with `stackpin build` (or pass --no-normalize)"
        )
        raise BuildError(msg)
    return int(value)


def normalize_config(
    config: Mapping[str, Any], *, diff_ids: Sequence[str], source_date_epoch: int
) -> bytes:
    """The image config with build-run fields fixed; canonical bytes (their digest = ID)."""
    out = copy.deepcopy(dict(config))
    created = rfc3339(source_date_epoch)
    out["created"] = created
    for key in VOLATILE_CONFIG_KEYS:
        out.pop(key, None)
    runtime = out.get("config")
    if isinstance(runtime, dict):
        # The classic builder records the previous step's image ID (a function of its
        # created time) and, on some versions, the build container's hostname.
        runtime["Image"] = ""
        runtime["Hostname"] = ""
    for entry in out.get("history") or []:
        entry["created"] = created
    out["rootfs"] = {"type": "layers", "diff_ids": list(diff_ids)}
    return canonical_bytes(out)


# --- the engine side -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NormalizeRequest:
    image: str  # the built image (ID or reference)
    tags: tuple[str, ...]  # moved to the normalised image
    keep_diff_ids: frozenset[str] = frozenset()  # base layers: passed through verbatim
    work_dir: Path  # temp folders are made (and removed) here
    cache_dir: Path | None = None  # remembers raw ID -> normalised ID
    # BuildKit's clamped steps made the layers reproducible: only the config is rewritten
    # (stackpin.normalize_record), where the store and the history allow it.
    layers_as_built: bool = False


@dataclass(frozen=True, kw_only=True)
class LayerOutcome:
    source_diff_id: str
    diff_id: str
    # "kept" (base layer), "unchanged" (already normal), "rewritten", or "as built" (the
    # config alone was rewritten: stackpin.normalize_record)
    action: str
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class NormalizeResult:
    image_id: str
    source_image_id: str
    tags: tuple[str, ...]
    seconds: float
    reused: bool  # True: taken from the cache, nothing saved or loaded
    layers: tuple[LayerOutcome, ...] = field(default_factory=tuple)


def normalize_image(
    engine: Engine, request: NormalizeRequest, *, on_line: Callable[[str], None] = _ignore
) -> NormalizeResult:
    """Save, rewrite, load and tag; see the module docstring."""
    started = time.monotonic()
    source = engine.image_info(request.image)
    if source is None:
        msg = f"image {request.image} is not in the daemon; build it first"
        raise BuildError(msg)
    cached = _cached_result(engine, request, source.id)
    if cached is not None:
        for reference in request.tags:
            engine.tag(cached, reference)
        return NormalizeResult(image_id=cached, source_image_id=source.id, tags=request.tags,
                               seconds=round(time.monotonic() - started, 2), reused=True)
    if request.layers_as_built:
        epoch = source_date_epoch_of(source.labels, request.image)
        image_id = normalize_config_only(engine, source, source_date_epoch=epoch, on_line=on_line)
        if image_id:
            as_built = tuple(LayerOutcome(source_diff_id=d, diff_id=d, action="as built")
                             for d in source.diff_ids)
            return _finish(engine, request, source.id, image_id, started, outcomes=as_built)
    request.work_dir.mkdir(parents=True, exist_ok=True)
    sweep_stale(request.work_dir)
    prefix = f"normalize-{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=request.work_dir) as tmp:
        folder = Path(tmp)
        on_line(f"normalize: saving {source.id[7:19]}")
        saved = unpack_save(chunk_stream(engine.save(SaveRequest(images=(source.id,)))), folder)
        epoch = source_date_epoch_of((saved.config.get("config") or {}).get("Labels") or {},
                                      request.image)
        on_line(f"normalize: rewriting {len(saved.layers)} layer(s) for SOURCE_DATE_EPOCH={epoch}")
        outcomes, files = _rewrite_layers(saved, request.keep_diff_ids, epoch, folder)
        config = normalize_config(
            saved.config, diff_ids=[o.diff_id for o in outcomes], source_date_epoch=epoch
        )
        omit = _held_by_the_daemon(engine, saved, outcomes)
        layout = image_layout(config, list(zip(
            [o.diff_id for o in outcomes], files, strict=True
        )), omit=omit)
        image_id = _present_id(engine, layout)
        if not image_id:
            on_line(f"normalize: loading {layout.config_digest[7:19]} "
                    f"({len(set(files)) - len(omit)} layer(s) sent, {len(omit)} held)")
            loaded = engine.load(layout.chunks)
            image_id = next((i for i in loaded.image_ids if layout.is_image(i)), "")
            if not image_id:
                msg = (
                    f"the daemon loaded {', '.join(loaded.image_ids) or 'nothing'} instead of "
                    f"the normalised {layout.config_digest}; rebuild with --no-normalize and "
                    "report this"
                )
                raise BuildError(msg)
    return _finish(engine, request, source.id, image_id, started, outcomes=tuple(outcomes))


def _finish(engine: Engine, request: NormalizeRequest, source_id: str, image_id: str,
            started: float, *, outcomes: tuple[LayerOutcome, ...]) -> NormalizeResult:
    """Tag the normal image, remember raw -> normal, and say what was done."""
    for reference in request.tags:
        engine.tag(image_id, reference)
    _remember(request, source_id, image_id)
    return NormalizeResult(image_id=image_id, source_image_id=source_id, tags=request.tags,
                           seconds=round(time.monotonic() - started, 2), reused=False,
                           layers=outcomes)


def _held_by_the_daemon(engine: Engine, saved: SavedImage,
                        outcomes: Sequence[LayerOutcome]) -> frozenset[str]:
    """Layers the load need not carry: on the classic store ``docker load`` never reads a
    layer whose chain the daemon holds, and the source image holds the chain of every
    layer that came out as it went in with all layers below it (the base's layers; any
    other layer that was already normal too, though on 20.10 BuildKit's are not). The
    containerd store wants every blob it does not hold by digest, so there all go."""
    if engine.version().store != "classic":
        return frozenset()
    source_chains = chain_ids([saved.layer_digests[path] for path in saved.layers])
    return omitted_blobs([[o.diff_id for o in outcomes]], source_chains)


def _present_id(engine: Engine, layout: ImageLayout) -> str:
    """The ID of the normalised image when the daemon holds it already (either store)."""
    for candidate in (layout.config_digest, layout.manifest_digest):
        info = engine.image_info(candidate)
        if info is not None and layout.is_image(info.id):
            return info.id
    return ""


def sweep_stale(work_dir: Path) -> None:
    """Remove temp folders of normalisations whose process is gone.

    A SIGTERM (``timeout``, a CI runner) ends Python without running ``finally``, which
    would leave gigabytes behind; the owner's PID is in the folder name.
    """
    for folder in work_dir.glob("normalize-*-*"):
        pid = folder.name.split("-")[1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)




def _rewrite_layers(
    saved: SavedImage, keep: frozenset[str], epoch: int, folder: Path
) -> tuple[list[LayerOutcome], list[Path]]:
    outcomes: list[LayerOutcome] = []
    files: list[Path] = []
    done: dict[Path, tuple[LayerOutcome, Path]] = {}
    for path in saved.layers:
        if path not in done:
            digest = saved.layer_digests[path]
            if digest in keep:
                done[path] = (LayerOutcome(source_diff_id=digest, diff_id=digest,
                                           action="kept"), path)
            else:
                done[path] = _rewrite_one(path, digest, epoch)
        outcome, result = done[path]
        outcomes.append(outcome)
        files.append(result)
    return outcomes, files


def _rewrite_one(path: Path, digest: str, epoch: int) -> tuple[LayerOutcome, Path]:
    target = path.with_name(path.name.replace("in-", "out-"))
    with path.open("rb") as source, target.open("wb") as out:
        stats = normalize_layer(source, out, source_date_epoch=epoch)
    if stats.diff_id == digest:
        target.unlink()
        return LayerOutcome(source_diff_id=digest, diff_id=digest, action="unchanged"), path
    path.unlink()  # the disk holds one copy of each layer at a time
    outcome = LayerOutcome(source_diff_id=digest, diff_id=stats.diff_id, action="rewritten",
                           removed=stats.removed)
    return outcome, target


# --- raw -> normalised cache: a warm rebuild (every step cached) costs a tag, not a save ---


def _cache_file(request: NormalizeRequest, source_id: str) -> Path | None:
    if request.cache_dir is None:
        return None
    key = canonical_bytes([NORMALIZE_VERSION, source_id, sorted(request.keep_diff_ids),
                           request.layers_as_built])
    return request.cache_dir / "normalize" / f"{hashlib.sha256(key).hexdigest()}.json"


def _cached_result(
    engine: Engine, request: NormalizeRequest, source_id: str
) -> str | None:
    path = _cache_file(request, source_id)
    if path is None or not path.is_file():
        return None
    with contextlib.suppress(ValueError, KeyError, TypeError):
        image_id = str(json.loads(path.read_text(encoding="utf-8"))["image_id"])
        if engine.image_info(image_id) is not None:
            return image_id
    return None


def _remember(request: NormalizeRequest, source_id: str, image_id: str) -> None:
    path = _cache_file(request, source_id)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"source_image_id": source_id, "image_id": image_id}) + "\n",
                   encoding="utf-8")
    tmp.replace(path)
