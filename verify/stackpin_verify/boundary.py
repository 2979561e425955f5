"""L0 checks of the vendor boundary and the device architecture (issue 11).

The image's image.json says what the vendor provides (exact versions with local labels),
what is excluded, and the cell's accelerator ISAs. A pip that swapped the vendor torch or
triton for an index build, an excluded bitsandbytes that slipped in, or a K100 image run on
a BW card (gfx928 vs gfx936) all pass an import; these checks fail them by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from stackpin_verify import capability, environment
from stackpin_verify.checks import Metrics, Skip, require
from stackpin_verify.context import Context

_ACCELERATED = ("cuda", "rocm", "dtk")


def judge_boundary(
    provided: Mapping[str, Mapping[str, str]],
    excluded: Mapping[str, str],
    version_of: Callable[[str], str | None],
) -> str | None:
    problems = []
    for name, reason in sorted(excluded.items()):
        found = version_of(name)
        if found is not None:
            problems.append(f"{name} {found} is installed but excluded here ({reason})")
    for name, entry in sorted(provided.items()):
        found = version_of(name)
        wanted = entry["version"]
        if found is None:
            problems.append(f"{name} is missing; the vendor's {wanted} is expected")
        elif found.lower() != wanted.lower():
            problems.append(f"{name} is {found}, not the vendor's {wanted}")
    return "; ".join(problems) or None


def check_boundary(ctx: Context) -> Metrics:
    image: dict[str, Any] = ctx.image or {}
    provided = image.get("provided") or {}
    excluded = image.get("excluded") or {}
    if not provided and not excluded:
        msg = "the image declares no vendor boundary"
        raise Skip(msg)
    metrics: Metrics = {"provided": sorted(provided), "excluded": sorted(excluded)}
    require(judge_boundary(provided, excluded, environment.dist_version), metrics)
    return metrics


def judge_arch(found: list[str], wanted: list[str]) -> str | None:
    if not found:
        return "no device visible to compare with the cell's arch"
    wrong = sorted({a for a in found if a not in wanted})
    if wrong:
        return (f"device arch {', '.join(wrong)} is not the cell's {', '.join(wanted)}: "
                "this image's kernels were built for another card; pick that card's cell")
    return None


def check_arch(ctx: Context) -> Metrics:
    wanted = [str(a) for a in (ctx.image or {}).get("arch") or []]
    if ctx.image_field("platform") not in _ACCELERATED or not wanted:
        msg = "not an accelerator image, or the cell names no arch"
        raise Skip(msg)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    found = [capability.device_arch(torch.device("cuda", i)) for i in range(count)]
    metrics: Metrics = {"wanted": wanted, "found": found}
    require(judge_arch(found, wanted), metrics)
    return metrics
