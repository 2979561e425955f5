"""In-image verification for stackpin images.

Self-contained on purpose: it imports only the standard library, torch and the optional
stack pieces an image may hold (numpy, triton, transformers, peft, trl, unsloth, flash_attn,
bitsandbytes), never stackpin, so the same code runs inside a container and on a bare host.
"""

from __future__ import annotations

REPORT_SCHEMA = "stackpin.verify/v1"
LEVELS = (0, 1, 2, 3, 4, 5, 6, 7, 8)

__all__ = ["LEVELS", "REPORT_SCHEMA"]
