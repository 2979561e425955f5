"""The save stream: docker save -> layers spooled uncompressed -> OCI layout -> zstd -> file."""

from __future__ import annotations

import io
import itertools
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, BinaryIO

import zstandard

from stackpin.bundle.format import ZSTD_LEVEL, StreamStats
from stackpin.engine import Engine, SaveRequest, chunk_stream
from stackpin.engine.save_format import LayoutImage, read_save, write_layout
from stackpin.meter import NO_METER, Meter, metered
from stackpin.primitives import HashingWriter


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
        self._out = HashingWriter(out)
        self.raw_bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.raw_bytes += len(view)
        self._emit(self._compressor.compress(view))
        return len(view)

    def finish(self) -> StreamStats:
        self._emit(self._compressor.flush())
        return StreamStats(tar_bytes=self.raw_bytes, bytes=self._out.size,
                           sha256=self._out.sha256.hexdigest())

    def _emit(self, data: bytes) -> None:
        if data:
            self._out.write(data)


@dataclass(frozen=True, kw_only=True)
class BundledImage:
    """The two IDs an image of the bundle gets when it is loaded (identity per store)."""

    source_id: str  # its ID in the exporting engine
    config_digest: str  # its ID once loaded into a classic store (and Engine 20.10)
    manifest_digest: str  # its ID once loaded into a containerd image store


def write_images(engine: Engine, names: Sequence[str], path: Path, *, threads: int,
                 meter: Meter = NO_METER) -> tuple[StreamStats, dict[str, BundledImage]]:
    """Save ``names`` as one stream and write it, rewritten, compressed and hashed, to ``path``.

    The engine's stream (either layout; gzip layers from a containerd store) is read once,
    its layers spooled uncompressed beside ``path``; then the OCI layout of the same
    images, configs unchanged, is written in a fixed order (save_format.write_layout), so
    zstd sees raw tar whatever the store and the bundle loads into either store under IDs
    known now. Returns the stream's figures and each image's IDs by its source ID.
    ``meter`` counts the save stream ("save": the images' sizes are its estimated total)
    and then the layout written ("compress").
    """
    version = engine.version()
    with tempfile.TemporaryDirectory(prefix=".layers-", dir=path.parent) as spool:
        count = itertools.count()

        def keep(data: IO[bytes]) -> Path:
            layer = Path(spool) / f"{next(count)}.tar"
            with layer.open("wb") as out:
                shutil.copyfileobj(data, out, 1 << 20)
            return layer

        meter.start("save", sum(_size(engine, name) for name in names))
        saved = read_save(chunk_stream(metered(
            engine.save(SaveRequest(images=tuple(sorted(names)))), meter)), keep)
        meter.finish()
        entries = sorted(saved.entries, key=lambda e: e.config_digest)
        layout = write_layout([LayoutImage(
            config=entry.config_bytes,
            layers=[(layer.diff_id, layer.value) for layer in saved.layers_of(entry)],
            tags=entry.repo_tags,
        ) for entry in entries])
        bundled = {
            version.image_id(config_digest=e.config_digest, manifest_digest=e.manifest_digest):
                BundledImage(source_id="", config_digest=config, manifest_digest=manifest)
            for e, (config, manifest) in zip(entries, layout.ids, strict=True)
        }
        with path.open("wb") as out:
            sink = CompressingSink(out, threads=threads)
            meter.start("compress", sum(path.stat().st_size
                                        for path in Path(spool).iterdir()))
            for chunk in metered(layout.chunks, meter):
                sink.write(chunk)
            stats = sink.finish()
            meter.finish()
            out.flush()
            os.fsync(out.fileno())
    return stats, {k: replace(v, source_id=k) for k, v in bundled.items()}


def _size(engine: Engine, name: str) -> int:
    info = engine.image_info(name)
    return info.size if info else 0
