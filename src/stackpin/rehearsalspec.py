"""What a vendor rehearsal cell says about itself (``Cell.rehearsal``), as data.

A rehearsal cell is never written in a matrix file: ``stackpin.rehearsal.derive`` makes it
from a real DTK or ROCm cell. This table is what it carries so that every consumer (the
image label, image.json and so the reports and the grid, `bundle export`) can say what it
is without knowing how it was made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from stackpin.declared import doc

# The run kind of an image built from stand-ins (stackpin.reports.RUN_KINDS).
RUN_KIND = "vendor rehearsal"


@dataclass(frozen=True, kw_only=True)
class Rehearsal:
    """A cell built from stand-ins for a real cell's vendor files: never a DCU/AMD image."""

    of: str = field(metadata=doc("The real cell this one rehearses (a DTK or ROCm cell)."))
    of_python: str = field(metadata=doc(
        "The real cell's CPython tag: the rehearsal runs the base's CPython instead, because "
        "no CPython of that version installs offline from the index."))
    content: str = field(metadata=doc(
        "One line: what the stand-in wheels hold instead of the vendor builds."))
    base_epoch: int = field(default=0, metadata=doc(
        "SOURCE_DATE_EPOCH of the rehearsal base (its host cell's, not this cell's), so every "
        "rehearsal cell starts from one Debian rootfs."))
    constraints: Mapping[str, str] = field(default_factory=dict, metadata=doc(
        "The real cell's locked index versions by name: they constrain the rehearsal's "
        "resolution, so it installs what the real lock does wherever its CPython allows."))


def describe(rehearsal: Rehearsal, *, python: str, platform: str) -> str:
    """One line for labels, image.json and refusals: what it is and what it is not."""
    return (
        f"vendor rehearsal of {rehearsal.of}: stand-in vendor files ({rehearsal.content}), "
        f"CPython {python} instead of {rehearsal.of_python}; not a {platform} image"
    )
