"""Runs the selected levels and assembles the report."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from stackpin_verify import environment
from stackpin_verify.checks import CheckResult
from stackpin_verify.context import Context

LEVEL_MODULES = {
    0: "stackpin_verify.level0",
    1: "stackpin_verify.level1",
    2: "stackpin_verify.level2",
    3: "stackpin_verify.level3",
    4: "stackpin_verify.level4",
    5: "stackpin_verify.level5",
    6: "stackpin_verify.level6",
    7: "stackpin_verify.level7",
}


def make_context(
    *,
    image_path: Path | None,
    dtype_choice: str,
) -> Context:
    image: dict[str, Any] | None = None
    error: str | None = None
    if image_path is not None:
        try:
            image = environment.load_image_info(image_path)
        except environment.ImageInfoError as exc:
            error = str(exc)
    backend = environment.detect_backend()
    # HIP builds expose their devices through the torch.cuda API as "cuda" devices.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return Context(
        backend=backend,
        device=device,
        image=image,
        dtype_choice=dtype_choice,
        image_error=error,
    )


def run_levels(ctx: Context, levels: Iterable[int]) -> tuple[list[CheckResult], dict[int, float]]:
    """All checks of the levels in order, and each level's wall-clock seconds."""
    results: list[CheckResult] = []
    durations: dict[int, float] = {}
    for level in sorted(set(levels)):
        start = time.perf_counter()
        module = importlib.import_module(LEVEL_MODULES[level])
        results.extend(module.run(ctx))
        durations[level] = time.perf_counter() - start
    return results, durations
