"""Platforms as data: one ``PlatformSpec`` module per platform (dtk, rocm, cuda, cpu).

As cibuildwheel keeps one module per platform behind one interface, each module here
declares ``SPEC``, and this package finds them: adding a platform is one new module (plus
its matrix, fixtures and docs), and no other file names it. Everything platform-specific
reads the spec, never a platform name; ``tests/unit/test_platforms.py`` greps for names
that slip back and renders, checks, locks and bundles a throw-away fifth platform.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from stackpin.platforms.spec import BaseTag, PlatformSpec

__all__ = ["BaseTag", "PlatformSpec", "base_tag", "get", "names", "specs"]


@functools.cache
def _registry() -> dict[str, PlatformSpec]:
    found: dict[str, PlatformSpec] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if module == "spec":
            continue
        spec = importlib.import_module(f"{__name__}.{module}").SPEC
        if not isinstance(spec, PlatformSpec) or spec.name != module:
            msg = f"{__name__}.{module}: SPEC must be a PlatformSpec named {module!r}"
            raise TypeError(msg)
        found[module] = spec
    return found


def specs() -> tuple[PlatformSpec, ...]:
    """Every platform in label-rank order: the order a wheel label's platforms are judged
    and reported in (a DAS label is a DTK build before it is a HIP one)."""
    return tuple(sorted(_registry().values(), key=lambda s: (s.label.rank, s.name)))


def names() -> tuple[str, ...]:
    """Every platform's name, in label-rank order: what a matrix's ``platform`` may be."""
    return tuple(spec.name for spec in specs())


def get(name: str) -> PlatformSpec:
    """The spec of a platform; a KeyError names the known ones (the matrix decoder has
    already refused any other name, so this is a bug, not bad input)."""
    try:
        return _registry()[name]
    except KeyError:
        msg = f"no platform {name!r}; known: {', '.join(names())}"
        raise KeyError(msg) from None


def base_tag(reference: str) -> BaseTag | None:
    """What a vendor base image's tag says (platform, its version, Python, stack), when a
    platform knows the vendor's naming; None for any other reference."""
    return next((tag for spec in specs() if (tag := spec.base_tag(reference)) is not None),
                None)
