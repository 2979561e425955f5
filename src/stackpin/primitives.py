"""Small primitives every module shares, each defined once.

Timestamps, canonical JSON, the read size for streams, hashing a stream as it passes, a
stream produced by a worker thread ahead of its consumer, the tar member writer, and a
folder staged beside its target then swapped in (with the PID-alive check that clears
the staging folders of dead runs). Pure standard library; imports nothing of stackpin,
so any module may use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import queue
import re
import shutil
import tarfile
import threading
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Literal, cast

# One read size for every stream (wheels, layers, bundles): 1 MiB keeps memory flat and
# the syscall count low.
CHUNK = 1 << 20


def rfc3339(epoch: int) -> str:
    """UTC seconds as the RFC 3339 text image configs and manifests use (…Z)."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def canonical_json(value: Any, *, ascii_only: bool = False) -> str:
    """Sorted keys, no spaces: equal values give equal bytes (what digests are taken of).

    ``ascii_only`` keeps the \\u escapes of the documents whose digests were defined with
    them (cell digests, bootstrap and docker-save configs); changing it would change them.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only)


def canonical_bytes(value: Any, *, ascii_only: bool = False) -> bytes:
    """``canonical_json`` as UTF-8 bytes."""
    return canonical_json(value, ascii_only=ascii_only).encode()


def pretty_json(value: Any) -> str:
    """Indented, sorted, newline-terminated: JSON files people read and diff."""
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (someone else's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- hashing streams ----------------------------------------------------------------------


def hash_stream(handle: IO[bytes]) -> tuple[int, str]:
    """Size and sha256 hex of everything left in ``handle``, read in CHUNKs."""
    digest, size = hashlib.sha256(), 0
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hash_stream(handle)[1]


class HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to ``out``."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._out.write(view)
        self.sha256.update(view)
        self.size += len(view)
        return len(view)


class HashingReader(io.RawIOBase):
    """A read-only file over ``inner`` that hashes and counts what is read through it."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self.sha256 = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(min(len(buffer), CHUNK))
        self.sha256.update(data)
        self.size += len(data)
        buffer[: len(data)] = data
        return len(data)


# --- producing a stream ahead of its consumer ------------------------------------------

_END = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class ReadAhead(Iterator[bytes]):
    """The same chunks in the same order, produced by a worker thread up to ``depth`` ahead.

    A pipe such as ``zstd -dc | docker load`` decompresses the next block while the last
    one is being written; a single thread alternates, and the reader on the other side of
    a socket waits each time. zstd and hashlib release the GIL, so the worker overlaps with
    the sending. The worker starts at once, not at the first ``next``: a save request is
    on its way while the caller does other work (an export writes its kept frames while
    the daemon prepares the save). An error of ``chunks`` is raised here after the chunks
    before it, in order; ``close`` stops the worker and closes ``chunks``. Memory stays
    bounded: at most ``depth`` chunks wait.
    """

    def __init__(self, chunks: Iterable[bytes], *, depth: int) -> None:
        self._waiting: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._worker = threading.Thread(target=_produce, args=(chunks, self._waiting, self._stop),
                                        daemon=True, name="read-ahead")
        self._worker.start()

    def __iter__(self) -> ReadAhead:
        return self

    def __next__(self) -> bytes:
        if self._done:
            raise StopIteration
        item = self._waiting.get()
        if item is _END or isinstance(item, _Failed):
            self.close()
            if isinstance(item, _Failed):
                raise item.error
            raise StopIteration
        return cast(bytes, item)  # the worker queues chunks, _END and _Failed only

    def close(self) -> None:
        self._done = True
        self._stop.set()
        self._worker.join()

    def __del__(self) -> None:
        self._stop.set()  # one never closed: its worker stops at its next offer


def _produce(chunks: Iterable[bytes], waiting: queue.Queue[object],
             stop: threading.Event) -> None:
    source = iter(chunks)
    try:
        for chunk in source:
            if not _offer(waiting, chunk, stop):
                return
        _offer(waiting, _END, stop)
    except BaseException as error:  # handed to the consumer, raised there
        _offer(waiting, _Failed(error), stop)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()  # a generator's own finally runs now, in this thread


def _offer(waiting: queue.Queue[object], item: object, stop: threading.Event) -> bool:
    """Queue ``item`` unless the consumer stopped first (it may never take another)."""
    while not stop.is_set():
        try:
            waiting.put(item, timeout=0.05)
        except queue.Full:
            continue
        return True
    return False


# --- tar members --------------------------------------------------------------------------

TarFormat = Literal[0, 1, 2]  # tarfile.USTAR_FORMAT, GNU_FORMAT, PAX_FORMAT


def tar_member(
    name: str, data: IO[bytes], size: int, *, mtime: int = 0, mode: int = 0o644,
    fmt: TarFormat = tarfile.USTAR_FORMAT,
) -> Iterator[bytes]:
    """One regular file of a tar stream: header (owner 0:0, no names), data, padding."""
    yield tar_header(name, size, mtime=mtime, mode=mode, fmt=fmt)
    while chunk := data.read(CHUNK):
        yield chunk
    if padding := tar_padding(size):
        yield padding


def tar_header(
    name: str, size: int, *, mtime: int = 0, mode: int = 0o644,
    fmt: TarFormat = tarfile.USTAR_FORMAT,
) -> bytes:
    """The header of one regular file (owner 0:0, no names): what ``tar_member`` starts with."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, mode
    return info.tobuf(format=fmt)


def tar_padding(size: int) -> bytes:
    """The zeros after a member body of ``size`` bytes, up to the next 512-byte block."""
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def tar_directory(name: str, *, mtime: int = 0, fmt: TarFormat = tarfile.USTAR_FORMAT) -> bytes:
    """The header of one directory (mode 0755, owner 0:0, no names)."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
    return info.tobuf(format=fmt)


def tar_end(written: int | None = None) -> bytes:
    """The end-of-archive marker: two zero blocks. Given the bytes ``written`` before it,
    also the zeros up to a whole record, as tar(1) and Python's tarfile end an archive."""
    end = b"\0" * (2 * tarfile.BLOCKSIZE)
    if written is None:
        return end
    return end + b"\0" * (-(written + len(end)) % tarfile.RECORDSIZE)


# --- staging a folder, then swapping it in ------------------------------------------------


@contextlib.contextmanager
def written_back(fd: int, *, every_s: float = 0.5) -> Iterator[None]:
    """Send a file's pages to the disk while it is still being written: a worker thread
    calls fdatasync every ``every_s``, so the caller's fsync at the end finds only the last
    of them dirty. On this 2-core machine one fsync of a 2000 MiB file at its end took
    3.8 s, time in which nothing else was done; here the disk writes beside the work."""
    stop = threading.Event()

    def write_back() -> None:
        while not stop.wait(every_s):
            with contextlib.suppress(OSError):  # the caller's own fsync reports errors
                os.fdatasync(fd)

    worker = threading.Thread(target=write_back, daemon=True, name="write-back")
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A fresh hidden folder beside ``target``, renamed into its place only on success.

    On an error the staging folder is removed and ``target`` is left as it was; the one
    that is replaced is removed after the swap. Staging folders of runs that died (their
    PID is gone) are cleared first.
    """
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(?:partial|old)-(\d+)$")
    for stale in parent.iterdir():
        match = pattern.match(stale.name)
        if match and (int(match.group(1)) == os.getpid() or not pid_alive(int(match.group(1)))):
            shutil.rmtree(stale, ignore_errors=True)
    staging = parent / f".{target.name}.partial-{os.getpid()}"
    staging.mkdir()
    try:
        yield staging
        old = parent / f".{target.name}.old-{os.getpid()}"
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
