"""The bundle format: file names, shared constants, records and the manifest (pure).

Everything the other bundle modules share lives here, so they import it and never each
other in a cycle.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from stackpin import __version__
from stackpin.bundle.delta import BaseLayer, Inventory
from stackpin.errors import BundleError
from stackpin.lock import Lock
from stackpin.matrix import VARIANTS, Cell, RunFlags, Variant
from stackpin.primitives import rfc3339
from stackpin.servicespec import Service
from stackpin.signing import Signer

FORMAT = "stackpin-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
SUMS = "SHA256SUMS"
IMAGES = "images.tar.zst"
# Level 3 with workers: measured within the export-time budget (docs/benchmarks.md)
# and smaller than `zstd -T0 -3`. Pinned: the level is part of the bundle's bytes.
ZSTD_LEVEL = 3
# The seed's ports (enhanced 18887, stable 18888), declared once with the service defaults.
DEFAULT_PORTS: Mapping[Variant, int] = {v: Service().endpoint(v).port for v in VARIANTS}
MAX_MANIFEST_BYTES = 16 << 20
# The site scripts read SHA256SUMS with sed and awk only below this size (bin/lib.sh
# MAX_SUMS_BYTES): export never writes a larger one.
MAX_SUMS_BYTES = 16 << 20
UNSIGNED = (MANIFEST, SIGNATURE)  # every other file is listed in the manifest
# The site puts its own model folders here (stackpin.bundle.models): in a bundle folder,
# files under it that the manifest does not list are the site's, not an extra file.
SITE_MODELS = "models/"
EXECUTABLE = re.compile(r"^bin/[^/]+\.sh$")

LineSink = Callable[[str], None]
SignatureState = Literal["verified", "not checked (insecure)"]


def ignore_line(_line: str) -> None:
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
    signer: Signer | None = None  # the key read where the user named it (the CLI)
    with_wheels: bool = False
    with_models: bool = False  # ship root/models/ (licence-declaring model folders)
    force: bool = False
    zstd_threads: int = -1  # -1: one worker per CPU; the bytes do not depend on it
    allow_rehearsal: frozenset[str] = frozenset()  # cells whose stand-in images may ship
    against: Inventory | None = None  # a site's inventory: ship only the layers it lacks
    frame_cache: Path | None = None  # layer frames kept between exports (bundle.framecache)


@dataclass(frozen=True, kw_only=True)
class BundleImage:
    """An image as the manifest records it (and the site scripts use it)."""

    cell: str
    variant: Variant
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
    service: Mapping[str, Any] | None = None  # render.service_info: what start.sh runs
    # The IDs it has once loaded, set by the export's stream: identity is per store.
    config_digest: str = ""  # on a classic store (and Engine 20.10)
    manifest_digest: str = ""  # on a containerd image store
    # A delta bundle leaves these layers out: the site must hold them (bundle.delta).
    base_layers: tuple[BaseLayer, ...] = ()

    @property
    def load_ids(self) -> tuple[str, str]:
        """Either ID names the image after a load, whichever store the site runs."""
        return (self.config_digest or self.id, self.manifest_digest or self.id)

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
class Entry:
    """One file of the bundle: its bytes, or the file it is copied from (and, for a
    locked wheel, the sha256 the copy must have)."""

    path: str
    data: bytes | None = None
    source: Path | None = None
    sha256: str = ""


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


# --- pure pieces ------------------------------------------------------------------------


def assign_profiles(
    pairs: Sequence[tuple[str, Variant]], ports: Mapping[tuple[str, Variant], int] | None = None
) -> list[tuple[str, int]]:
    """Profile name and loopback port per (cell, variant), in order.

    A variant bundled for one cell is its own profile on the port its service declares
    (``stable`` on 18888, ``enhanced`` on 18887 by default, as in the field); when several
    cells bring the same variant the profile is ``<cell>.<variant>`` and each further
    cell's ports sit 2 below the previous cell's.
    """
    declared = ports or {}
    counts: dict[Variant, int] = {}
    for _cell, variant in pairs:
        counts[variant] = counts.get(variant, 0) + 1
    cell_order = list(dict.fromkeys(cell for cell, _ in pairs))
    result = []
    for cell, variant in pairs:
        name = variant if counts[variant] == 1 else f"{cell}.{variant}"
        base = declared.get((cell, variant), DEFAULT_PORTS.get(variant, 18889))
        port = base - 2 * cell_order.index(cell)
        result.append((name, port))
    return result


def run_flags_json(flags: RunFlags) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(flags).items()}


def created_epoch(cells: Iterable[Cell]) -> int:
    """The bundle's only timestamp: the newest SOURCE_DATE_EPOCH of its cells."""
    return max(cell.source_date_epoch for cell in cells)


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
    against: str | None = None,
) -> dict[str, Any]:
    """The manifest document (pure); ``files`` must include SHA256SUMS; ``against`` is the
    sha256 of the site inventory a delta bundle was made against."""
    by_path = {f.path: f for f in files}
    if SUMS not in by_path or IMAGES not in by_path:
        msg = f"internal: the manifest needs {SUMS} and {IMAGES} among the files"
        raise BundleError(msg)
    epoch = created_epoch(s.cell for s in selections)
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
        "delta": None if against is None else {"inventory_sha256": against},
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



# The characters a bundle path may use (the site scripts apply the same pattern to
# SHA256SUMS): no spaces, quotes, controls or shell metacharacters, nothing hidden.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]*(/[A-Za-z0-9_+-][A-Za-z0-9._+-]*)*$")


def safe_relative(path: str) -> bool:
    """A plain relative path inside the bundle: no '..', no absolute path, plain characters."""
    parts = PurePosixPath(path).parts
    return (len(path) <= 1024 and bool(_SAFE_PATH.fullmatch(path)) and ".." not in parts
            and str(PurePosixPath(*parts)) == path)
