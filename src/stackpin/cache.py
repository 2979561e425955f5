"""The machine-wide cache: bootstrapped rootfs tars and normalisation results.

Shared by every checkout on the host (a CI clone reuses what a developer's checkout
bootstrapped), because both are facts about this Docker daemon and this mirror state,
not about one working tree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$STACKPIN_CACHE_DIR, else $XDG_CACHE_HOME/stackpin, else ~/.cache/stackpin."""
    env = os.environ if environ is None else environ
    if explicit := env.get("STACKPIN_CACHE_DIR"):
        return Path(explicit)
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stackpin"
