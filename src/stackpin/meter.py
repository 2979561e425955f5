"""Byte meters: how long work (save, export, load, verify) says how far it is.

The core only counts: it calls ``start(label, total)``, ``advance(count)`` for each chunk
and ``finish()``; the CLI decides how to show it (``stackpin.cli.progress.ByteProgress``:
a bar on a terminal, periodic plain lines in CI). ``total`` is exactly what the phase will
count, except where ``estimate`` says it cannot be known before the end (a save stream:
the engine reports unpacked image sizes, the stream adds tar headers). A meter shows an
estimate as one ("~"), grows it when passed, and ``finish`` makes the total what was
really counted.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import IO, Any, Protocol


class Meter(Protocol):
    def start(self, label: str, total: int, *, estimate: bool = False) -> None: ...

    def advance(self, count: int) -> None: ...

    def finish(self) -> None: ...


class NoMeter:
    """The meter of library calls and tests: counts nothing, shows nothing."""

    def start(self, label: str, total: int, *, estimate: bool = False) -> None:
        """Nothing to show."""

    def advance(self, count: int) -> None:
        """Nothing to count."""

    def finish(self) -> None:
        """Nothing to close."""


NO_METER = NoMeter()


def metered(chunks: Iterable[bytes], meter: Meter) -> Iterator[bytes]:
    """The same chunks, each counted as it passes."""
    for chunk in chunks:
        meter.advance(len(chunk))
        yield chunk


class MeteredReader(io.RawIOBase):
    """A read-only file object over ``inner`` that counts every byte read from it."""

    def __init__(self, inner: IO[bytes], meter: Meter) -> None:
        self._inner = inner
        self._meter = meter

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        buffer[: len(data)] = data
        self._meter.advance(len(data))
        return len(data)
