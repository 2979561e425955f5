"""Loading a verified bundle: the images stream into the daemon, then their IDs are checked.

Memory stays bounded whatever the file holds: zstd output is pulled at most ``CHUNK``
bytes per call from a decompressor whose window is capped at ``MAX_WINDOW``, and the
total is capped by the uncompressed size the signed manifest declares, so a zstd bomb
stops after ``tar_bytes`` instead of asking for gigabytes. The last chunk is held back
until the compressed bytes have hashed to the verified sha256 and the size matched: a
file swapped between the check and the load breaks the stream before ``docker load``
has a complete archive, so nothing of it is loaded.

The chunks are decompressed and hashed by a worker thread a few chunks ahead of the
socket (``ReadAhead``), as ``zstd -dc | docker load`` overlaps its two processes: the
checks above run in that worker unchanged, and the held-back last chunk still reaches the
daemon only after them.
"""

from __future__ import annotations

import contextlib
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

import zstandard

from stackpin.bundle import trust
from stackpin.bundle.delta import chain_ids
from stackpin.bundle.format import IMAGES, LineSink, ignore_line
from stackpin.bundle.verify import VerifyResult, open_stream, refuse, verify
from stackpin.engine import Engine
from stackpin.errors import BundleError
from stackpin.meter import NO_METER, Meter, metered
from stackpin.primitives import CHUNK, HashingReader, ReadAhead
from stackpin.target import LABEL_CELL

MAX_WINDOW = 1 << 27  # zstd's own default limit (128 MiB); stackpin writes 2 MiB windows
AHEAD = 8  # chunks decompressed ahead of the daemon: 8 MiB, enough to keep the socket fed


@contextlib.contextmanager
def _images_stream(source: Path) -> Iterator[IO[bytes]]:
    if stat.S_ISDIR(source.lstat().st_mode):
        with (source / IMAGES).open("rb") as handle:
            yield handle
        return
    with source.open("rb") as handle, open_stream(handle) as tar:
        for info in tar:
            if info.isreg() and PurePosixPath(info.name).parts[1:] == (IMAGES,):
                extracted = tar.extractfile(info)
                assert extracted is not None
                yield extracted
                return
    raise refuse(source, f"{IMAGES} is missing")


class CheckedChunks:
    """Decompressed chunks of a verified file, capped and checked before the last one.

    ``expected_sha256`` and ``compressed_bytes`` are the verified file's; ``tar_bytes``
    is the uncompressed size the signed manifest declares.
    """

    def __init__(self, source: Path, handle: IO[bytes], *, expected_sha256: str,
                 compressed_bytes: int, tar_bytes: int) -> None:
        self._source = source
        self._reader = HashingReader(handle)
        self._expected = expected_sha256
        self._compressed = compressed_bytes
        self._limit = tar_bytes
        self.out_bytes = 0

    @property
    def tar_bytes(self) -> int:
        return self._limit

    def __iter__(self) -> Iterator[bytes]:
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
        held = b""
        try:
            reader: IO[bytes] = self._reader  # type: ignore[assignment]  # duck-typed read()
            with decompressor.stream_reader(reader, read_size=CHUNK,
                                            read_across_frames=True) as stream:
                while chunk := stream.read(CHUNK):
                    self.out_bytes += len(chunk)
                    if self.out_bytes > self._limit:
                        raise refuse(self._source, f"{IMAGES} decompresses to more than the "
                                     f"{self._limit} bytes the manifest declares")
                    if held:
                        yield held
                    held = chunk
        except zstandard.ZstdError as exc:
            raise refuse(self._source, f"{IMAGES} is not a valid zstd stream ({exc})") from None
        while self._reader.read(CHUNK):  # trailing bytes still count towards the hash
            pass
        self.confirm()
        yield held

    def confirm(self) -> None:
        """Raise unless every byte matched what was verified."""
        if (self._reader.sha256.hexdigest() != self._expected
                or self._reader.size != self._compressed):
            raise refuse(self._source, f"{IMAGES} changed while it was being loaded")
        if self.out_bytes != self._limit:
            raise refuse(self._source, f"{IMAGES} decompresses to {self.out_bytes} bytes, not "
                         f"the {self._limit} the manifest declares")


@dataclass(frozen=True, kw_only=True)
class LoadReport:
    verified: VerifyResult
    image_ids: tuple[str, ...] = field(default_factory=tuple)


def id_after_load(engine: Engine, image: dict[str, object]) -> str:
    """The ID the image will have in this engine: identity is per store (the config digest
    on a classic store, the manifest digest on a containerd store); older bundles carry
    only the exporting engine's "id"."""
    config, manifest = (str(image.get(k) or "") for k in ("config_digest", "manifest_digest"))
    if not (config and manifest):
        return str(image["id"])
    return engine.version().image_id(config_digest=config, manifest_digest=manifest)


def load(engine: Engine, source: Path, *, site: trust.Trust,
         on_line: LineSink = ignore_line, meter: Meter = NO_METER) -> LoadReport:
    """Verify everything, then stream the images into the daemon and check their IDs.

    ``meter`` counts the verification ("verify") and then the uncompressed stream the
    daemon reads ("load", whose total the signed manifest declares).
    """
    verified = verify(source, site=site, meter=meter)
    manifest = verified.manifest
    entry = next(e for e in manifest["files"] if e["path"] == IMAGES)
    on_line(f"bundle: verified {verified.files} files (signature {verified.signature}); "
            "loading")
    refuse_missing_base(engine, source, manifest)
    wanted = tuple(id_after_load(engine, i) for i in manifest["images"])
    # Only images this load brought in are taken back on failure, never older ones.
    new = tuple(i for i in wanted if engine.image_info(i) is None)
    with _images_stream(source) as handle:
        chunks = CheckedChunks(source, handle, expected_sha256=str(entry["sha256"]),
                               compressed_bytes=int(entry["size"]),
                               tar_bytes=int(manifest["images_archive"]["tar_bytes"]))
        meter.start("load", chunks.tar_bytes)
        # Closed here, not left to the garbage collector: a daemon that stops reading
        # early must not leave the worker waiting on a file this block closes.
        with contextlib.closing(ReadAhead(chunks, depth=AHEAD)) as ahead:
            try:
                engine.load(metered(ahead, meter))
            except BundleError:
                _take_back(engine, new)
                raise
    meter.finish()
    try:
        chunks.confirm()
    except BundleError:
        _take_back(engine, new)  # belt and braces: the stream above already broke
        raise
    missing = [i for i in wanted if engine.image_info(i) is None]
    if missing:
        msg = f"{source}: after the load the daemon lacks {missing[0]}: check `docker images`"
        raise BundleError(msg)
    return LoadReport(verified=verified, image_ids=wanted)


def refuse_missing_base(engine: Engine, source: Path, manifest: Mapping[str, Any]) -> None:
    """A delta bundle lacks the layers its site held: refuse it, naming them, where this
    engine does not hold them (in a stackpin image: a delta builds on an earlier bundle)."""
    wanted = {str(b["chain_id"]): str(b["diff_id"]) for image in manifest["images"]
              for b in image.get("base_layers", ())}
    if not wanted:
        return
    held = {chain for info in engine.list_images(LABEL_CELL)
            for chain in chain_ids(info.diff_ids)}
    missing = sorted(chain for chain in wanted if chain not in held)
    if missing:
        named = ", ".join(f"{chain} (diff {wanted[chain]})" for chain in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise refuse(source, f"a delta bundle whose {len(missing)} base layer(s) this engine "
                     f"lacks: {named}{more}; load the bundle it was made against first, or "
                     "a full bundle")


def _take_back(engine: Engine, image_ids: tuple[str, ...]) -> None:
    for image_id in image_ids:
        if engine.image_info(image_id) is not None:
            engine.remove_image(image_id, force=True)
