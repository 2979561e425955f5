"""The vendor boundary of an image (issue 11), judged once for the build guard and L0.

The image's image.json says what the vendor provides (exact versions with local labels)
and what is excluded. A pip that swapped the vendor torch or triton for an index build, or
an excluded bitsandbytes that slipped in, passes an import; this rule fails it by name.
The build guard (templates/guard.py, with this file copied beside it) and verify's
L0.boundary (level0) both judge with ``boundary_problems``.

Standard library only, and nothing else of stackpin_verify: the guard runs it as a plain
module in the install stage, before anything is trusted, and an image need not hold
``packaging``; so its one name rule, PEP 503's (packaging's ``canonicalize_name``), is
written out here (tests/unit/test_guard.py holds it equal to packaging's).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_SEPARATORS = re.compile(r"[-_.]+")


def canonical_name(name: str) -> str:
    """A distribution's name as PEP 503 compares it: ``Foo__Bar.baz`` -> ``foo-bar-baz``."""
    return _SEPARATORS.sub("-", name).lower()


def boundary_problems(
    provided: Mapping[str, Mapping[str, str]],
    excluded: Mapping[str, str],
    version_of: Callable[[str], str | None],
) -> list[str]:
    """One line per breach: an excluded distribution installed, a provided one missing or
    not the vendor's build. ``version_of`` answers for a distribution name, or None."""
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
    return problems


def judge_boundary(
    provided: Mapping[str, Mapping[str, str]],
    excluded: Mapping[str, str],
    version_of: Callable[[str], str | None],
) -> str | None:
    return "; ".join(boundary_problems(provided, excluded, version_of)) or None
