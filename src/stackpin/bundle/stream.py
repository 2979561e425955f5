"""The save stream: docker save -> each layer compressed while spooled -> OCI layout -> file.

Each layer's member body (plus its padding to 512 bytes) is compressed into a zstd frame of
its own while it is spooled, by zstd's worker threads as the daemon's stream arrives. The
output is written in the layout's order as concatenated frames: each layer's header in a
frame of its own, each layer's frame copied as it is, and the documents after the layers
(configs, manifests, index.json, manifest.json, oci-layout) in one last frame. Concatenated
frames are one zstd stream (``zstd -dc``, ``stream_reader(..., read_across_frames=True)``)
whose content is the layout's tar, byte for byte.

The layers come first in the layout, sorted by diff_id, and the images' configs name them
before the save starts (``engine.image_info``). So the output is written as early as each
layer is at hand (``LayoutWriter``): frames kept by an earlier export while the daemon
prepares the save (its silence before the first byte: 22-25 s for the CUDA images), and
the layers a classic store sends, in that very order, as each one ends. Only what comes
out of order (a containerd store's gzip blobs are sorted by another digest; Engine 20.10
names layers otherwise) waits in the spool until the save has ended.
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
    LayerGuessMissed,
    LayoutImage,
    Piece,
    SaveContents,
    layer_header,
    layout_layers,
    read_save,
    write_layout,
)
from stackpin.engine.types import HistoryItem
from stackpin.errors import BundleError
from stackpin.meter import NO_METER, Meter, metered
from stackpin.primitives import (
    CHUNK,
    HashingWriter,
    ReadAhead,
    sha256_file,
    tar_padding,
    written_back,
)

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


@dataclass(frozen=True, kw_only=True)
class WrittenLayer:
    diff_id: str
    header: bytes  # the frame of its tar header, as written
    frame: Path  # the frame copied after it
    sha256: str  # of that frame, taken as it was copied


class LayoutWriter:
    """``images.tar.zst`` in the layout's order, each layer written as soon as it and every
    layer before it in ``order`` are at hand; ``finish`` writes the rest.

    What was written early is a guess at the layout's start (the configs and the kept
    records named the layers): ``finish`` holds it to the layout made from the save, and
    writes the file again from its first byte where they differ.
    """

    def __init__(self, out: BinaryIO, order: Sequence[str],
                 compressor: zstandard.ZstdCompressor) -> None:
        self._out = out
        self._sink = HashingWriter(out)
        self.order = order
        self._compressor = compressor
        self._ready: dict[str, tuple[int, Path]] = {}
        self.written: list[WrittenLayer] = []

    def offer(self, diff_id: str, size: int, frame: Path) -> None:
        """``frame`` holds the layer ``diff_id`` (``size`` bytes of tar); the first offer
        of a layer stands."""
        self._ready.setdefault(diff_id, (size, frame))
        while len(self.written) < len(self.order) and self.order[len(self.written)] in self._ready:
            diff_id = self.order[len(self.written)]
            size, frame = self._ready[diff_id]
            header = io.BytesIO()
            compress_frame(self._compressor, [layer_header(diff_id, size)], header)
            self._sink.write(header.getvalue())
            self.written.append(WrittenLayer(diff_id=diff_id, header=header.getvalue(),
                                             frame=frame, sha256=self._copy(frame)))

    def flush(self) -> None:
        self._out.flush()

    def _copy(self, frame: Path, meter: Meter = NO_METER) -> str:
        digest = hashlib.sha256()
        with frame.open("rb") as source:
            while chunk := source.read(CHUNK):
                self._sink.write(chunk)
                digest.update(chunk)
                meter.advance(len(chunk))
        return digest.hexdigest()

    def finish(self, frames: Frames, meter: Meter) -> tuple[StreamStats, dict[Path, str]]:
        """Write the parts of ``frames`` not written yet; return the stream's figures and
        the sha256 of each layer frame, taken as it was copied."""
        done = 2 * len(self.written)  # each written layer: its header's frame, its frame
        if not _starts_with(frames.parts, self.written):
            self._out.seek(0)
            self._out.truncate()
            self._sink, self.written, done = HashingWriter(self._out), [], 0
        digests = {w.frame: w.sha256 for w in self.written}
        rest = frames.parts[done:]
        meter.start("write", sum(len(p) if isinstance(p, bytes) else p.stat().st_size
                                 for p in rest))
        for part in rest:
            if isinstance(part, bytes):
                self._sink.write(part)
                meter.advance(len(part))
            else:
                digests[part] = self._copy(part, meter)
        meter.finish()
        stats = StreamStats(tar_bytes=frames.tar_bytes, bytes=self._sink.size,
                            sha256=self._sink.sha256.hexdigest())
        return stats, digests


def _starts_with(parts: Sequence[bytes | Path], written: Sequence[WrittenLayer]) -> bool:
    """Whether the layout's frames begin with what was written: each layer's header frame,
    then its frame (the same file, or one of the same bytes)."""
    if len(parts) < 2 * len(written):
        return False
    for index, layer in enumerate(written):
        header, frame = parts[2 * index], parts[2 * index + 1]
        if header != layer.header or not isinstance(frame, Path):
            return False
        if frame != layer.frame and sha256_file(frame) != layer.sha256:
            return False
    return True


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
    each layer compressed into its own frame as it arrives; the OCI layout of the same
    images, configs unchanged, is written in a fixed order (save_format.write_layout), so
    zstd sees raw tar whatever the store and the bundle loads into either store under IDs
    known now. Returns the stream's figures and each image's IDs by its source ID.
    ``meter`` counts the kept frames written before the save's first byte ("kept"), the
    save stream ("save": the images' sizes are its estimated total; compression and the
    writing of layers in order run meanwhile) and then what is left to write ("write").
    ``held``: chain IDs the site holds (``bundle.delta``): a layer held wherever the images
    use it is left out of the stream. ``frame_cache``: a folder of frames kept between
    exports (``framecache``): a layer an earlier export compressed is hashed as the save
    sends it, and its kept frame copied.
    """
    try:
        try:
            return _write_images(engine, names, path, threads=threads, meter=meter,
                                 held=held, frame_cache=frame_cache)
        except LayerGuessMissed:
            # Two docker-archive layers of one size and first MiB: rare, and the save is
            # read again with no frame guessed (those it compresses are kept after it).
            return _write_images(engine, names, path, threads=threads, meter=meter,
                                 held=held, frame_cache=frame_cache, guess=False)
    except BaseException:
        path.unlink(missing_ok=True)  # written from its first layer on: never left half
        raise


def _write_images(engine: Engine, names: Sequence[str], path: Path, *, threads: int,
                  meter: Meter, held: frozenset[str], frame_cache: Path | None,
                  guess: bool = True) -> tuple[StreamStats, dict[str, BundledImage]]:
    compressor = frame_compressor(threads)
    cache = FrameCache(frame_cache, level=ZSTD_LEVEL) if frame_cache is not None else None
    # The request goes out before anything else: the daemon prepares the whole save before
    # it sends a byte (22-25 s for the CUDA images), and all that is done here before the
    # first byte (the images' layer lists, the kept frames) runs meanwhile. The socket is
    # then read by a thread of its own, ahead of the parsing, hashing and compressing here:
    # read in turn, the two waited on each other.
    save = engine.save(SaveRequest(images=tuple(sorted(names))))
    with contextlib.closing(ReadAhead(save, depth=SAVE_AHEAD)) as ahead, \
            tempfile.TemporaryDirectory(prefix=".layers-", dir=path.parent) as folder, \
            path.open("wb") as out, written_back(out.fileno()):
        version = engine.version()
        spool = FrameSpool(Path(folder), compressor)
        writer = LayoutWriter(out, _layer_order(engine, names, held), compressor)
        estimate = save_estimate(engine, names)
        if cache is not None:
            _write_kept(writer, cache, meter)
        meter.start("save", estimate, estimate=True)
        saved = read_save(
            chunk_stream(metered(ahead, meter)), spool.keep,
            known=_known_layers(cache, guess=guess),
            on_read=lambda layer: writer.offer(layer.diff_id, layer.value.size,
                                               layer.value.path))
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
        stats, frame_digests = writer.finish(frames_of(layout.pieces, compressor), meter)
        out.flush()
        os.fsync(out.fileno())
        if cache is not None:
            _keep_frames(cache, saved, frame_digests)
    return stats, {k: replace(v, source_id=k) for k, v in bundled.items()}


def _layer_order(engine: Engine, names: Sequence[str], held: frozenset[str]) -> list[str]:
    """The layers the layout will carry, in its order, as the images' configs name them."""
    per_image = [list(info.diff_ids) for name in sorted(names)
                 if (info := engine.image_info(name)) is not None]
    omit = omitted_blobs(per_image, held)
    return layout_layers(d for layers in per_image for d in layers if d not in omit)


def _write_kept(writer: LayoutWriter, cache: FrameCache, meter: Meter) -> None:
    """Offer every kept frame of the layout's layers: those in order from its first layer
    are written now, the others once the save has filled the gaps before them. The save
    must still send each of these layers, and each must hash to its name."""
    kept = [found for diff_id in writer.order
            if (found := cache.layer(diff_id)) is not None and found.diff_id == diff_id]
    first = list(itertools.takewhile(lambda pair: pair[0].diff_id == pair[1],
                                     zip(kept, writer.order, strict=False)))
    meter.start("kept", sum(found.path.stat().st_size for found, _ in first))
    for found in kept:
        before = len(writer.written)
        writer.offer(found.diff_id, found.size, found.path)
        meter.advance(sum(w.frame.stat().st_size for w in writer.written[before:]))
    writer.flush()  # on its way to the disk while the daemon still prepares
    meter.finish()


def _known_layers(cache: FrameCache | None, *, guess: bool,
                  ) -> Callable[[str], KnownLayer[SpooledLayer] | None] | None:
    """What ``read_save`` may take from the cache; after a missed guess (only a
    docker-archive makes guesses), nothing, though each layer is still named to be kept."""
    if cache is None:
        return None
    return _cached_layers(cache) if guess else lambda _name: None


def _cached_layers(cache: FrameCache) -> Callable[[str], KnownLayer[SpooledLayer] | None]:
    def known(blob: str) -> KnownLayer[SpooledLayer] | None:
        found = cache.get(blob)
        if found is None:
            return None
        return KnownLayer(diff_id=found.diff_id, size=found.size, value=SpooledLayer(
            path=found.path, size=found.size, sha256=found.sha256))
    return known


def _keep_frames(cache: FrameCache, saved: SaveContents[SpooledLayer],
                 frame_digests: Mapping[Path, str]) -> None:
    """Check each frame copied from the cache against the digest it was kept with, and keep
    each frame compressed now. A damaged frame fails the export (its bundle is not used)."""
    for layer in saved.layers.values():
        written = frame_digests.get(layer.value.path)
        if layer.blob and written is None and cache.layer(layer.diff_id) is not None:
            # compressed again beside the frame written ahead: found by this name next time
            with contextlib.suppress(OSError):
                cache.name(layer.blob, layer.diff_id)
        if not layer.blob or written is None:
            continue  # a blob not its name says, or a layer the bundle leaves out
        if layer.value.sha256 and written != layer.value.sha256:
            cache.forget(layer.diff_id)
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


# The diff ID of a layer with no files (1024 zero bytes): a step that changed nothing. Its
# history entry says 0 bytes, like a step without a layer.
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def save_estimate(engine: Engine, names: Sequence[str]) -> int:
    """The save stream's size as far as it is known before it comes.

    A save carries each layer once, however many images share it (stable and enhanced share
    all but their attention layers; summing image sizes showed twice the stream), and each
    image once, however many of its tags are named. The history gives each layer's
    unpacked size; the image's size says what the save sends of it (the same on a classic
    store; gzip blobs on the containerd store, a third of it), so each layer counts its
    share of that. An image whose history cannot be matched to its layers counts whole.
    The stream adds tar headers, so the meter is told this is an estimate."""
    layers: dict[str, float] = {}
    whole: dict[str, int] = {}
    for name in names:
        info = engine.image_info(name)
        if info is None:
            continue
        record = engine.image_record(name)
        sizes = layer_sizes(record.diff_ids, record.history) if record else None
        unpacked = sum(sizes.values()) if sizes else 0
        if sizes is None or not unpacked:
            whole[info.id] = info.size
            continue
        for diff_id, size in sizes.items():
            layers[diff_id] = size * info.size / unpacked
    return round(sum(layers.values())) + sum(whole.values())


def layer_sizes(diff_ids: Sequence[str],
                history: Sequence[HistoryItem]) -> dict[str, int] | None:
    """Each layer's unpacked size: the history's steps with bytes are the layers with files,
    in order. None where they do not pair one to one (a layer of whiteouts alone says 0)."""
    steps = [item.size for item in history if item.size > 0]
    filled = [diff_id for diff_id in diff_ids if diff_id != EMPTY_LAYER]
    if len(steps) != len(filled):
        return None
    return {**dict.fromkeys(diff_ids, 0), **dict(zip(filled, steps, strict=True))}
