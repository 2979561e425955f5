"""The one golden-file helper: compare text with tests/golden/..., or rewrite it on request.

Regenerate after an intended change with STACKPIN_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE_ENV = "STACKPIN_UPDATE_GOLDEN"


def assert_golden(relative: str, text: str) -> None:
    """``text`` must equal tests/golden/<relative> byte for byte."""
    path = GOLDEN / relative
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; run {UPDATE_ENV}=1 pytest and review the diff"
    assert text == path.read_text(encoding="utf-8"), (
        f"{path} differs; if the change is intended, run {UPDATE_ENV}=1 pytest and review it"
    )
