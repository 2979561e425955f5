"""The save stream: docker save -> each layer compressed while spooled -> OCI layout -> file.

The layout lists blobs sorted by digest, known only once the whole save has arrived, so
the layers must wait on disk; compressing them only then would run zstd after the save
instead of beside it. Instead each layer's member body (plus its padding to 512 bytes)
is compressed into a zstd frame of its own while it is spooled, by zstd's worker threads
as the daemon's stream arrives. The output is written in the layout's order as
concatenated frames: the layout's own bytes between two layers (member headers,
documents, the trailing files) in one frame each, each layer's frame copied as it is.
Concatenated frames are one zstd stream (``zstd -dc``, ``stream_reader(...,
read_across_frames=True)``) whose content is the layout's tar, byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, BinaryIO

import zstandard

from stackpin.bundle.delta import BaseLayer, held_layers, omitted_blobs
from stackpin.bundle.format import ZSTD_LEVEL, StreamStats
from stackpin.bundle.framecache import FrameCache
from stackpin.engine import Engine, SaveRequest, chunk_stream
from stackpin.engine.save_format import (
    KnownLayer,
    Layer,
    LayoutImage,
    Piece,
    SaveContents,
    read_save,
    write_layout,
)
from stackpin.errors import BundleError
from stackpin.meter import NO_METER, Meter, metered
from stackpin.primitives import CHUNK, HashingWriter, read_ahead, tar_padding

# Save-stream chunks (1 MiB each) the socket reader may run ahead of the compression.
SAVE_AHEAD = 16


def frame_compressor(threads: int, *, level: int = ZSTD_LEVEL) -> zstandard.ZstdCompressor:
    """The one compressor of every frame of a bundle stream."""
    # threads >= 1 selects zstd's multi-threaded format, whose bytes do not depend on
    # the number of workers; threads=0 is a different (single-threaded) framing. Its
    # workers also compress while the calling thread goes on reading the daemon's stream.
    workers = threads if threads >= 1 else max(os.cpu_count() or 1, 1)
    params = zstandard.ZstdCompressionParameters.from_level(
        level, threads=workers, write_checksum=True
    )
    return zstandard.ZstdCompressor(compression_params=params)


def compress_frame(compressor: zstandard.ZstdCompressor, chunks: Iterable[bytes],
                   out: BinaryIO) -> int:
    """Write ``chunks`` to ``out`` as one zstd frame; return how many bytes went in.

    No content size is pledged: the frame header must not depend on whether the engine
    told a layer's size (a gzip layer from a containerd store does not).
    """
    frame = compressor.compressobj()
    size = 0
    for chunk in chunks:
        size += len(chunk)
        out.write(frame.compress(chunk))
    out.write(frame.flush())
    return size


@dataclass(frozen=True, kw_only=True)
class SpooledLayer:
    path: Path  # one zstd frame: the layer's tar, then its padding to 512 bytes
    size: int  # bytes of the uncompressed tar, without the padding
    sha256: str = ""  # a frame from the cache: the frame's digest when it was kept


class FrameSpool:
    """Layers as the save reader hands them over, each compressed into its own frame."""

    def __init__(self, folder: Path, compressor: zstandard.ZstdCompressor) -> None:
        self._folder = folder
        self._compressor = compressor
        self._names = itertools.count()

    def keep(self, data: IO[bytes]) -> SpooledLayer:
        path = self._folder / f"{next(self._names)}.zst"
        size = 0

        def body() -> Iterator[bytes]:
            nonlocal size
            while chunk := data.read(CHUNK):
                size += len(chunk)
                yield chunk
            yield tar_padding(size)  # the tar's block padding belongs to the body's frame

        with path.open("wb") as out:
            compress_frame(self._compressor, body(), out)
        return SpooledLayer(path=path, size=size)


@dataclass(frozen=True, kw_only=True)
class Frames:
    """The output, frame by frame: compressed bytes, or a spooled layer's frame file."""

    parts: tuple[bytes | Path, ...]
    tar_bytes: int  # what they decompress to

    @property
    def compressed_bytes(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.stat().st_size for p in self.parts)


def frames_of(pieces: Iterable[Piece], compressor: zstandard.ZstdCompressor) -> Frames:
    """The layout's pieces as frames: its own bytes between two layers compressed into one
    frame each (a few KiB in all: headers and documents), each layer as its spooled frame."""
    parts: list[bytes | Path] = []
    pending: list[bytes] = []
    tar_bytes = 0

    def close_run() -> None:
        nonlocal tar_bytes
        if pending:
            buffer = io.BytesIO()
            tar_bytes += compress_frame(compressor, pending, buffer)
            parts.append(buffer.getvalue())
            pending.clear()

    for piece in pieces:
        if isinstance(piece, Layer):
            close_run()
            parts.append(piece.path)
            tar_bytes += piece.size + len(tar_padding(piece.size))
        else:
            pending.append(piece)
    close_run()
    return Frames(parts=tuple(parts), tar_bytes=tar_bytes)


def write_frames(frames: Frames, out: BinaryIO, meter: Meter, *, each_frame: bool = False,
                 ) -> tuple[StreamStats, dict[Path, str]]:
    """Write ``frames`` to ``out`` in order, hashing and counting the compressed bytes;
    with ``each_frame``, the sha256 of each layer's frame too, taken as it was copied."""
    sink = HashingWriter(out)
    frame_digests: dict[Path, str] = {}
    meter.start("write", frames.compressed_bytes)
    for part in frames.parts:
        if isinstance(part, bytes):
            sink.write(part)
            meter.advance(len(part))
            continue
        digest = hashlib.sha256() if each_frame else None
        with part.open("rb") as frame:
            while chunk := frame.read(CHUNK):
                sink.write(chunk)
                if digest is not None:
                    digest.update(chunk)
                meter.advance(len(chunk))
        if digest is not None:
            frame_digests[part] = digest.hexdigest()
    meter.finish()
    stats = StreamStats(tar_bytes=frames.tar_bytes, bytes=sink.size,
                        sha256=sink.sha256.hexdigest())
    return stats, frame_digests


@dataclass(frozen=True, kw_only=True)
class BundledImage:
    """The two IDs an image of the bundle gets when it is loaded (identity per store)."""

    source_id: str  # its ID in the exporting engine
    config_digest: str  # its ID once loaded into a classic store (and Engine 20.10)
    manifest_digest: str  # its ID once loaded into a containerd image store
    base_layers: tuple[BaseLayer, ...] = ()  # left out: the site holds them (a delta)


def write_images(engine: Engine, names: Sequence[str], path: Path, *, threads: int,
                 meter: Meter = NO_METER, held: frozenset[str] = frozenset(),
                 frame_cache: Path | None = None,
                 ) -> tuple[StreamStats, dict[str, BundledImage]]:
    """Save ``names`` as one stream and write it, rewritten, compressed and hashed, to ``path``.

    The engine's stream (either layout; gzip layers from a containerd store) is read once,
    each layer compressed into its own frame in a spool beside ``path`` as it arrives;
    then the OCI layout of the same images, configs unchanged, is written in a fixed order
    (save_format.write_layout), so zstd sees raw tar whatever the store and the bundle
    loads into either store under IDs known now. Returns the stream's figures and each
    image's IDs by its source ID. ``meter`` counts the save stream ("save": the images'
    sizes are its estimated total; compression runs meanwhile) and then the compressed
    bytes written ("write"). ``held``: chain IDs the site holds (``bundle.delta``): a
    layer held wherever the images use it is left out of the stream. ``frame_cache``: a
    folder of frames kept between exports (``framecache``): a layer an earlier export
    compressed is hashed as the save sends it and its kept frame copied.
    """
    version = engine.version()
    compressor = frame_compressor(threads)
    cache = FrameCache(frame_cache, level=ZSTD_LEVEL) if frame_cache is not None else None
    with tempfile.TemporaryDirectory(prefix=".layers-", dir=path.parent) as folder:
        spool = FrameSpool(Path(folder), compressor)
        meter.start("save", save_estimate(engine, names), estimate=True)
        # The daemon's socket is read by a thread of its own, ahead of the parsing, hashing
        # and compressing here: read in turn, the two waited on each other (on 2 cores,
        # 10 s of a CUDA export's 51 went to this thread waiting on the socket).
        save = engine.save(SaveRequest(images=tuple(sorted(names))))
        with contextlib.closing(read_ahead(save, depth=SAVE_AHEAD)) as ahead:
            saved = read_save(chunk_stream(metered(ahead, meter)), spool.keep,
                              known=_cached_layers(cache) if cache is not None else None)
        meter.finish()
        entries = sorted(saved.entries, key=lambda e: e.config_digest)
        diff_ids = [[layer.diff_id for layer in saved.layers_of(e)] for e in entries]
        omit = omitted_blobs(diff_ids, held)
        layout = write_layout([LayoutImage(
            config=entry.config_bytes,
            layers=[Layer(diff_id=layer.diff_id, size=layer.value.size, path=layer.value.path)
                    for layer in saved.layers_of(entry)],
            tags=entry.repo_tags,
        ) for entry in entries], omit=omit)
        bundled = {
            version.image_id(config_digest=e.config_digest, manifest_digest=e.manifest_digest):
                BundledImage(source_id="", config_digest=config, manifest_digest=manifest,
                             base_layers=tuple(b for b in held_layers(layers, held)
                                               if b.diff_id in omit))
            for e, (config, manifest), layers in zip(entries, layout.ids, diff_ids, strict=True)
        }
        frames = frames_of(layout.pieces, compressor)
        with path.open("wb") as out:
            stats, frame_digests = write_frames(frames, out, meter,
                                                each_frame=cache is not None)
            out.flush()
            os.fsync(out.fileno())
        if cache is not None:
            _keep_frames(cache, saved, frame_digests)
    return stats, {k: replace(v, source_id=k) for k, v in bundled.items()}


def _cached_layers(cache: FrameCache) -> Callable[[str], KnownLayer[SpooledLayer] | None]:
    def known(blob: str) -> KnownLayer[SpooledLayer] | None:
        found = cache.get(blob)
        if found is None:
            return None
        return KnownLayer(diff_id=found.diff_id, value=SpooledLayer(
            path=found.path, size=found.size, sha256=found.sha256))
    return known


def _keep_frames(cache: FrameCache, saved: SaveContents[SpooledLayer],
                 frame_digests: Mapping[Path, str]) -> None:
    """Check each frame copied from the cache against the digest it was kept with, and keep
    each frame compressed now. A damaged frame fails the export (its bundle is not used)."""
    for layer in saved.layers.values():
        written = frame_digests.get(layer.value.path)
        if not layer.blob or written is None:
            continue  # a docker-archive layer, or one the bundle leaves out
        if layer.value.sha256 and written != layer.value.sha256:
            cache.forget(layer.blob)
            msg = (f"the frame kept for layer {layer.blob} in {cache.folder} is damaged and "
                   "was removed: run the export again (it compresses that layer anew)")
            raise BundleError(msg)
        if not layer.value.sha256:
            # A cache that cannot be written only makes the next export slower: the bundle
            # is whole already.
            with contextlib.suppress(OSError):
                cache.put(layer.blob, layer.value.path, diff_id=layer.diff_id,
                          size=layer.value.size, sha256=written)
    with contextlib.suppress(OSError):
        cache.trim()


def save_estimate(engine: Engine, names: Sequence[str]) -> int:
    """The save stream's size as far as it is known before it comes: each image once,
    however many of its tags are named (a build tags an image twice; summing per name
    showed twice the stream). The stream adds tar headers to the sizes the engine reports,
    and images sharing layers carry them once, so the meter is told this is an estimate."""
    sizes: dict[str, int] = {}
    for name in names:
        info = engine.image_info(name)
        if info is not None:
            sizes[info.id] = info.size
    return sum(sizes.values())
