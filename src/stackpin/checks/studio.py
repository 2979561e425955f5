"""Cross-checks of the product: does each DTK and ROCm cell serve Unsloth Studio, or say why not?

Studio ships inside the unsloth wheel (``studio/backend/run.py``); a cell serves it when it
declares ``[service]`` and pins an unsloth that carries it. A cell that cannot hold one
declares ``[service_blocked]``: the requirement of the Studio release that it fails. That
claim is checked against the cell's own pins, so a stale reason (the torch was upgraded,
the blocker no longer blocks) is an error, not a comment that lies.

Each rule reads a Context and yields Violations (see checks.context).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackpin import platforms
from stackpin.checks.context import Context, Violation
from stackpin.matrix import Cell
from stackpin.servicespec import ServiceBlocker

# unsloth 2025.10.12's wheel has no studio/ folder and 2026.10.9's has: the oldest release
# this project checked to ship Studio (../shared/studio-facts.md).
STUDIO_SINCE = Version("2026.10.9")


def _declared(ctx: Context) -> Iterator[Violation]:
    cell = ctx.cell
    if cell.service is not None and cell.service_blocked is not None:
        yield ctx.violation(
            "service_blocked", "either [service] or [service_blocked]", "both",
            "remove [service_blocked]: the cell serves Studio",
        )
    # The platforms the product must reach (issue 21) say so in their spec; the other
    # platforms' cells may be tool images.
    elif cell.service is None and cell.service_blocked is None and cell.spec.serves_product:
        # A warning: a tool image is a valid cell; the shipped matrices are held to the
        # product by a test (tests/unit/test_studio_cells.py).
        yield ctx.violation(
            "service", f"[service] (Unsloth Studio) on every {_product_titles()} cell", "none",
            "declare [service], or [service_blocked] with the requirement that blocks Studio",
            severity="warning",
        )


def _product_titles() -> str:
    return " and ".join(s.title for s in platforms.specs() if s.serves_product)


def _studio_pinned(ctx: Context) -> Iterator[Violation]:
    cell = ctx.cell
    if cell.service is None:
        return
    key = next((k for k in cell.stack if canonicalize_name(k) == "unsloth"), None)
    pinned = _version(cell.stack[key]) if key is not None else None
    if pinned is None or pinned < STUDIO_SINCE:
        found = f"unsloth {cell.stack[key]}" if key is not None else "no unsloth in [stack]"
        yield ctx.violation(
            "stack.unsloth", f"unsloth >= {STUDIO_SINCE} (ships studio/) for [service]",
            found, f"pin unsloth and unsloth-zoo {STUDIO_SINCE} in [stack] and lock again",
        )


def _blocker(ctx: Context) -> Iterator[Violation]:
    blocker = ctx.cell.service_blocked
    if blocker is None:
        return
    try:
        requirement = Requirement(blocker.requirement)
    except InvalidRequirement:
        yield ctx.violation(
            "service_blocked.requirement", "a PEP 508 requirement, e.g. torch>=2.4.0",
            repr(blocker.requirement), "write the requirement as the release's metadata has it",
        )
        return
    have = cell_version(ctx.cell, requirement.name)
    if have is None and canonicalize_name(requirement.name) == "torch" and ctx.torch:
        have = _version(ctx.torch.version)
    if have is None:
        yield ctx.violation(
            "service_blocked.requirement", f"a version of {requirement.name} in the cell",
            "none", "name a distribution the cell pins (torch, provided, [stack])",
        )
    elif requirement.specifier.contains(have, prereleases=True):
        yield ctx.violation(
            "service_blocked", f"a requirement the cell fails ({blocker.of})",
            f"{requirement} holds for {requirement.name} {have}",
            "the blocker no longer blocks: declare [service] and pin a Studio-bearing unsloth",
        )
    else:
        yield ctx.violation("service", "Unsloth Studio", _blocked_line(blocker, have),
                            "the image is built without a service", severity="warning")


def _blocked_line(blocker: ServiceBlocker, have: Version) -> str:
    return f"none: {blocker.of} requires {blocker.requirement}, this cell has {have}"


def cell_version(cell: Cell, dist: str) -> Version | None:
    """The version this cell installs of a distribution: provided first, then [stack]."""
    name = canonicalize_name(dist)
    for key, provided in cell.provided.items():
        if canonicalize_name(key) == name:
            return _version(provided.version)
    for key, text in cell.stack.items():
        if canonicalize_name(key) == name:
            return _version(text)
    return None


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


RULES: tuple[Callable[[Context], Iterator[Violation]], ...] = (
    _declared,
    _studio_pinned,
    _blocker,
)
