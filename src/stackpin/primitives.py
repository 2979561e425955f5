"""Small primitives every module shares, each defined once.

Timestamps, canonical JSON, the read size for streams and the PID-alive check used to
clear the staging folders of dead runs. Pure standard library; imports nothing of
stackpin, so any module may use it.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

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
