"""Compressed layer frames kept between exports, by the digest the save stream names them by.

After the daemon's first byte an export is CPU-bound on zstd (docs/benchmarks.md): every
byte of every layer is compressed, though most layers of an image (the base, torch, the
stack below a changed pin) were compressed by the export before, into the same bytes. As
BuildKit keeps a compressed blob per layer, stackpin keeps each layer's frame here. An
export still reads every layer the save sends and hashes it against the blob's name
(``save_format.read_save``), then copies the kept frame instead of compressing again.

A frame's bytes depend on the layer's bytes, the zstd level and libzstd's version (its
match finder changes between releases), so all three are the key: a bundle is the same
bytes whether its frames came from here or from the compressor. A frame is kept by its
layer's diff_id (``<hex>.zst`` and its record ``<hex>.json``), so an export can find it
from the image's config before the save sends anything; a compressed blob (the containerd
store's gzip layers) is found through ``<blob hex>.alias``, which names the diff_id, and so
is an Engine 20.10 ``layer.tar`` by a name made of its size and first MiB (a guess, held to
the diff_id once the layer's bytes are hashed: ``save_format.tar_head_name``). Each
frame's sha256 is kept beside it and checked as the frame is copied into a bundle. The
folder is trimmed to a size, least recently used first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zstandard

_HEX64 = re.compile(r"[0-9a-f]{64}")
KEEP_BYTES = 4 << 30  # frames kept at most: a CUDA cell's two variants and the CPU cell


@dataclass(frozen=True, kw_only=True)
class CachedFrame:
    path: Path  # the layer's frame, as a bundle stream carries it
    diff_id: str  # the uncompressed tar's digest (the blob's own for an uncompressed blob)
    size: int  # bytes of the uncompressed tar, without its padding
    sha256: str  # of the frame file


class FrameCache:
    """Frames by blob digest (``sha256:<hex>``) for one zstd level and libzstd version."""

    def __init__(self, root: Path, *, level: int, keep_bytes: int = KEEP_BYTES) -> None:
        libzstd = ".".join(map(str, zstandard.ZSTD_VERSION))
        self.folder = root / f"zstd-{libzstd}-level{level}"
        self._keep_bytes = keep_bytes

    def _path(self, digest: str, suffix: str) -> Path | None:
        algorithm, _, hexdigest = digest.partition(":")
        if algorithm != "sha256" or not _HEX64.fullmatch(hexdigest):
            return None
        return self.folder / f"{hexdigest}{suffix}"

    def get(self, blob: str) -> CachedFrame | None:
        """The frame kept for the save's ``blob``: its layer's own, or the one its alias
        names; None if never kept, or its record is unreadable."""
        found = self.layer(blob)
        if found is not None:
            return found
        alias = self._path(blob, ".alias")
        try:
            diff_id = alias.read_text().strip() if alias is not None else ""
        except OSError:
            return None
        return self.layer(diff_id) if diff_id else None

    def layer(self, diff_id: str) -> CachedFrame | None:
        """The frame kept for the layer ``diff_id``; None if never kept, its record
        unreadable, or the frame not the size the record says."""
        frame, record = self._path(diff_id, ".zst"), self._path(diff_id, ".json")
        if frame is None or record is None:
            return None
        try:
            fields = json.loads(record.read_text())
            found = CachedFrame(path=frame, diff_id=str(fields["diff_id"]),
                                size=int(fields["size"]), sha256=str(fields["sha256"]))
            if frame.stat().st_size != int(fields["bytes"]):
                return None
            os.utime(record)  # recently used: trimmed last
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return found

    def put(self, blob: str, spooled: Path, *, diff_id: str, size: int, sha256: str) -> None:
        """Keep ``spooled`` (a frame that hashed to ``sha256`` as it was written) for the
        layer ``diff_id``, sent as ``blob``: linked where the file system allows, else
        copied; the record goes after the frame, and an alias after the record, so a frame
        is found only once whole."""
        frame, record = self._path(diff_id, ".zst"), self._path(diff_id, ".json")
        alias = self._path(blob, ".alias") if blob != diff_id else None
        if frame is None or record is None or (blob != diff_id and alias is None):
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".put-", dir=self.folder) as scratch:
            staged = Path(scratch) / "frame"
            try:
                os.link(spooled, staged)
            except OSError:  # another file system: the frame is copied
                shutil.copyfile(spooled, staged)
            staged.replace(frame)
            fields = {"diff_id": diff_id, "size": size, "sha256": sha256,
                      "bytes": frame.stat().st_size}
            (Path(scratch) / "record").write_text(json.dumps(fields, sort_keys=True))
            (Path(scratch) / "record").replace(record)
        if alias is not None:
            self.name(blob, diff_id)

    def name(self, blob: str, diff_id: str) -> None:
        """Let the kept frame of ``diff_id`` be found as ``blob`` too."""
        alias = self._path(blob, ".alias")
        if alias is None or blob == diff_id:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.folder, prefix=".alias-",
                                         delete=False) as staged:
            staged.write(diff_id)
        Path(staged.name).replace(alias)

    def forget(self, diff_id: str) -> None:
        """Drop the frame of the layer ``diff_id`` (found damaged); its aliases then lead
        nowhere, and ``trim`` removes them."""
        for suffix in (".zst", ".json"):
            path = self._path(diff_id, suffix)
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def trim(self) -> None:
        """Drop the least recently used frames until the folder holds at most its size."""
        if not self.folder.is_dir():
            return
        records = []
        for record in self.folder.glob("*.json"):
            frame = record.with_suffix(".zst")
            with contextlib.suppress(OSError):
                records.append((record.stat().st_mtime, frame.stat().st_size, record, frame))
        total = sum(size for _, size, _, _ in records)
        for _, size, record, frame in sorted(records, key=lambda r: r[0]):
            if total <= self._keep_bytes:
                break
            for path in (record, frame):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            total -= size
        for alias in self.folder.glob("*.alias"):  # those whose frame went
            with contextlib.suppress(OSError):
                target = self._path(alias.read_text().strip(), ".json")
                if target is None or not target.exists():
                    alias.unlink()
