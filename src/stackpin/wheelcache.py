"""The machine-wide wheel cache: locked wheels kept by their sha256, shared by checkouts.

A CUDA cell's wheelhouse is 3.1 GB from the index; a fresh clone (every CI run) or a cell
edit that only changes the lock's cell digest would otherwise download all of it again.
A wheel is kept under ``<cache>/wheels/<sha256>/<filename>`` as a hard link to the file
pip downloaded and checked against the lock's hash, so keeping it costs no disk while the
wheelhouse holds it.

Honesty: a cached file is re-hashed every time it is taken and must equal the lock's
sha256, so a bit flipped in the cache (or in a wheelhouse sharing its inode) is never
installed: the entry is dropped and the wheel is downloaded again. What the cache cannot
prove is that the index still serves the file; ``stackpin wheels fetch --no-cache`` asks
the index for every wheel.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from stackpin.primitives import sha256_file

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def entry(cache: Path, sha256: str, filename: str) -> Path:
    """Where the wheel with this digest is kept (the digest is checked: it names a folder)."""
    if not _SHA256.match(sha256) or "/" in filename or filename in ("", ".", ".."):
        msg = f"not a wheel cache key: {sha256!r} {filename!r}"
        raise ValueError(msg)
    return cache / "wheels" / sha256 / filename


def take(cache: Path, *, sha256: str, filename: str, dest: Path) -> bool:
    """Link the cached wheel to ``dest`` when it is there and hashes to ``sha256``.

    A cached file with another digest is removed (it would be downloaded again).
    """
    path = entry(cache, sha256, filename)
    if not path.is_file():
        return False
    if sha256_file(path) != sha256:
        with contextlib.suppress(OSError):
            path.unlink()
        return False
    try:
        os.link(path, dest)
    except OSError:  # another filesystem: the cache saves no download there
        return False
    return True


def keep(cache: Path, *, sha256: str, path: Path) -> None:
    """Keep a wheel pip downloaded and checked against ``sha256`` (best effort: a cache
    that cannot be written, or is on another filesystem, only costs a later download)."""
    target = entry(cache, sha256, path.name)
    if target.is_file():
        return
    with contextlib.suppress(OSError):
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.unlink(missing_ok=True)  # left by a run that died between link and rename
        os.link(path, partial)
        partial.replace(target)
