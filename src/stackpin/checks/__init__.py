"""Cross-checks of a matrix cell: do its pins fit together before anything is built?

Pure: a Cell in, a list of Violations out. Every rule runs on every cell and every
violation is returned, so a release engineer fixes a matrix in one pass. The rules
encode ../shared/dcu-facts.md (issue 2, item 5); each says why where it is not obvious.

The rules live by what they read: ``checks.wheels`` (filenames, tags, vendor labels) and
``checks.settings`` (numpy, variants, bitsandbytes, environment, base, hashes) and
``checks.studio`` (the served product, or why a cell cannot serve it); all
speak the vocabulary of ``checks.context``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from stackpin.abi import WheelInfo, parse_wheel_filename
from stackpin.checks import settings, studio, wheels
from stackpin.checks.context import Context, Severity, Violation, Wheel
from stackpin.checks.settings import excludes_numpy2
from stackpin.errors import ConfigurationError, ValidationError
from stackpin.matrix import Cell, PinnedWheel, pinned_wheels
from stackpin.matrixfile import cell_problems_of

__all__ = ["Severity", "Violation", "check_cell", "check_cells", "excludes_numpy2",
           "require_resolvable"]

_RULES: tuple[Callable[[Context], Iterator[Violation]], ...] = (
    settings.boundary,
    *wheels.RULES,
    *settings.RULES,
    *studio.RULES,
)


def check_cells(cells: Iterable[Cell]) -> list[Violation]:
    """Every violation of every cell, cells in the order given."""
    return [v for cell in cells for v in check_cell(cell)]


def check_cell(cell: Cell) -> list[Violation]:
    """Every violation of one cell, in rule order."""
    wheels = tuple(_parse(path, pin) for path, pin in pinned_wheels(cell))
    torch = wheels[0].info
    ctx = Context(cell=cell, wheels=wheels, torch=torch)
    found: list[Violation] = []
    for rule in _RULES:
        found.extend(rule(ctx))
    return found


def _parse(path: str, pin: PinnedWheel) -> Wheel:
    try:
        info: WheelInfo | None = parse_wheel_filename(pin.filename)
    except ValidationError:
        info = None
    return Wheel(path=path, pin=pin, info=info)


def require_resolvable(cell: Cell) -> None:
    """Refuse a cell with a malformed value (3) or a rule violation (4) before anything is
    resolved, locked, downloaded or written for it; warnings (unpinned hashes) pass."""
    if problems := cell_problems_of(cell):
        msg = (f"{cell.id}: {problems[0]}; nothing was done: 'stackpin matrix check' lists "
               "every problem")
        raise ConfigurationError(msg)
    errors = [v for v in check_cell(cell) if v.severity == "error"]
    if errors:
        msg = (f"{errors[0]}; nothing was done ({len(errors)} violation(s); "
               "'stackpin matrix check' lists all)")
        raise ValidationError(msg)
