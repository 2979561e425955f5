"""Reading input that may be hostile: bounded reads, strict JSON, one-line names.

Every file stackpin reads from outside (bundle manifests and signatures, reports, matrix
files, keys) goes through here, so each rule has one home:

- ``read_bounded``: a regular file, checked for its size *before* a byte is read, and read
  with a hard cap anyway (a file can grow between the check and the read). Directories,
  devices, fifos and sockets are refused, so ``/dev/zero`` costs nothing.
- ``parse_json``: strict UTF-8, no NaN/Infinity, integers of at most 20 digits, nesting of
  at most ``MAX_DEPTH`` levels; anything else is one error of the caller's class, never
  RecursionError, ValueError or a traceback.
- ``shown``: a name as it may appear in a one-line message: control characters (newline,
  carriage return, escape...) are escaped, so a file name cannot forge an output line.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# The error a refusal raises, made from its one-line message (a stackpin.errors class:
# this module sits below errors, which quotes through ``shown``).
ErrorOf = Callable[[str], Exception]

MAX_DEPTH = 64
MAX_INT_DIGITS = 20
MAX_SHOWN = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def shown(text: object, *, limit: int = MAX_SHOWN) -> str:
    """``text`` made safe for one line of output: controls escaped, length capped."""
    value = str(text)
    if len(value) > limit:
        value = value[:limit] + "..."
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), value)


def read_bounded(path: Path, *, limit: int, what: str, error: ErrorOf,
                 follow_links: bool = True) -> bytes:
    """The bytes of the regular file ``path``, refused unless it holds at most ``limit``.

    Opened non-blocking, so a fifo is refused instead of waiting for a writer.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        msg = f"cannot read {what} {shown(path)} ({shown(exc.strerror or exc)})"
        raise error(msg) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            msg = f"{what} {shown(path)} is not a regular file (a directory, device or fifo)"
            raise error(msg)
        size = info.st_size
        data = b"" if size > limit else _read_at_most(fd, limit + 1)
    except OSError as exc:
        msg = f"cannot read {what} {shown(path)} ({shown(exc.strerror or exc)})"
        raise error(msg) from None
    finally:
        os.close(fd)
    if size > limit or len(data) > limit:
        msg = f"{what} {shown(path)} is larger than {limit} bytes: not a file stackpin wrote"
        raise error(msg)
    return data


def _read_at_most(fd: int, limit: int) -> bytes:
    parts, total = [], 0
    while total < limit and (part := os.read(fd, min(1 << 20, limit - total))):
        parts.append(part)
        total += len(part)
    return b"".join(parts)


def parse_json(data: bytes, *, what: str, error: ErrorOf) -> Any:
    """``data`` as JSON under the strict rules above, or one ``error``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{what} is not UTF-8 (byte {exc.start}): not a file stackpin wrote"
        raise error(msg) from None
    try:
        value = json.loads(text, parse_int=_small_int, parse_float=_finite_float,
                           parse_constant=_no_constant)
    except RecursionError:
        msg = f"{what} is nested too deeply: not a file stackpin wrote"
        raise error(msg) from None
    except (ValueError, OverflowError) as exc:  # JSONDecodeError is a ValueError
        msg = f"{what} is not JSON ({shown(exc, limit=120)})"
        raise error(msg) from None
    if depth(value) > MAX_DEPTH:
        msg = f"{what} is nested more than {MAX_DEPTH} levels deep: not a file stackpin wrote"
        raise error(msg)
    return value


def depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (iterative: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def _small_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        msg = f"an integer of {len(text)} digits"
        raise ValueError(msg)
    return int(text)


def _finite_float(text: str) -> float:
    if len(text) > 40:
        msg = f"a number of {len(text)} characters"
        raise ValueError(msg)
    value = float(text)
    if not math.isfinite(value):
        msg = f"the number {text[:20]} is out of range"
        raise ValueError(msg)
    return value


def _no_constant(text: str) -> Any:
    msg = f"{text} is not JSON"
    raise ValueError(msg)
