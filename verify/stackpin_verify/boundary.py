"""L0 check of the vendor boundary (issue 11).

The image's image.json says what the vendor provides (exact versions with local labels)
and what is excluded. A pip that swapped the vendor torch or triton for an index build, or
an excluded bitsandbytes that slipped in, passes an import; this check fails it by name.
(The device-arch check is L0.arch in level0.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stackpin_verify import environment
from stackpin_verify.checks import Metrics, Skip, require
from stackpin_verify.context import Context


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
