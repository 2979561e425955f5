"""The save stream: docker save -> normalised tar -> zstd -> file, hashed in one pass."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO

import zstandard

from stackpin.bundle.format import ZSTD_LEVEL, StreamStats
from stackpin.engine import Engine, SaveRequest
from stackpin.errors import BundleError

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


