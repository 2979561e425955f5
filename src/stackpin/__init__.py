"""stackpin: pinned ABI matrices to verified, reproducible images and offline bundles."""

from __future__ import annotations

__version__ = "0.1.0"
