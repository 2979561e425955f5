"""Loading a verified bundle: the images stream into the daemon, then their IDs are checked."""

from __future__ import annotations

import contextlib
import hashlib
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

import zstandard

from stackpin.bundle.format import CHUNK, IMAGES, LineSink, ignore_line
from stackpin.bundle.verify import VerifyResult, refuse, verify
from stackpin.engine import Engine
from stackpin.errors import BundleError


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
    raise refuse(source, f"{IMAGES} is missing")


class _HashingChunks:
    """The decompressed chunks of a file, hashing the compressed bytes as they pass."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.sha = hashlib.sha256()

    def _compressed(self) -> Iterator[bytes]:
        while chunk := self._handle.read(CHUNK):
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
         on_line: LineSink = ignore_line) -> LoadReport:
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
        raise refuse(source, f"{IMAGES} changed while it was being loaded")
    missing = [i for i in wanted if engine.image_info(i) is None]
    if missing:
        msg = f"{source}: after the load the daemon lacks {missing[0]}: check `docker images`"
        raise BundleError(msg)
    return LoadReport(verified=verified, image_ids=wanted)
