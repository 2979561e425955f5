"""Compressed layer frames kept between exports, by the digest the save stream names them by.

After the daemon's first byte an export is CPU-bound on zstd (docs/benchmarks.md): every
byte of every layer is compressed, though most layers of an image (the base, torch, the
stack below a changed pin) were compressed by the export before, into the same bytes. As
BuildKit keeps a compressed blob per layer, stackpin keeps each layer's frame here. An
export still reads every layer the save sends and hashes it against the blob's name
(``save_format.read_save``), then copies the kept frame instead of compressing again.

A frame's bytes depend on the layer's bytes, the zstd level and libzstd's version (its
match finder changes between releases), so all three are the key: a bundle is the same
bytes whether its frames came from here or from the compressor. Each frame's sha256 is kept
beside it and checked as the frame is copied into a bundle. The folder is trimmed to a size,
least recently used first.
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

    def _paths(self, blob: str) -> tuple[Path, Path] | None:
        algorithm, _, hexdigest = blob.partition(":")
        if algorithm != "sha256" or not _HEX64.fullmatch(hexdigest):
            return None
        return self.folder / f"{hexdigest}.zst", self.folder / f"{hexdigest}.json"

    def get(self, blob: str) -> CachedFrame | None:
        """The frame kept for ``blob``, or None (never kept, or its record unreadable)."""
        paths = self._paths(blob)
        if paths is None:
            return None
        frame, record = paths
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
        """Keep ``spooled`` (a frame that hashed to ``sha256`` as it was written) for ``blob``:
        linked where the file system allows, else copied; the record goes last, so a frame
        is found only once whole."""
        paths = self._paths(blob)
        if paths is None:
            return
        frame, record = paths
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

    def forget(self, blob: str) -> None:
        """Drop ``blob``'s frame (found damaged)."""
        for path in self._paths(blob) or ():
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
