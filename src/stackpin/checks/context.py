"""The vocabulary of the matrix cross-checks: a Violation, and what every rule reads."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Literal

from packaging.version import Version

from stackpin.abi import WheelInfo
from stackpin.matrix import Cell, PinnedWheel
from stackpin.untrusted import shown

Severity = Literal["error", "warning"]

@dataclass(frozen=True, kw_only=True)
class Violation:
    """One broken rule of one cell, printed as one line."""

    cell: str
    field: str
    expected: str
    found: str
    fix: str
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"{self.cell}: {self.field}"
        line = f"{where}: expected {self.expected}, found {self.found}; {self.fix}"
        return shown(line, limit=2000)  # a matrix value cannot break the line

    def to_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


@dataclass(frozen=True, kw_only=True)
class Wheel:
    """A pinned wheel with its matrix path and, when its filename parses, what it says."""

    path: str
    pin: PinnedWheel
    info: WheelInfo | None


@dataclass(frozen=True, kw_only=True)
class Context:
    cell: Cell
    wheels: tuple[Wheel, ...]
    torch: WheelInfo | None

    @property
    def torch_version(self) -> Version | None:
        return self.torch.public_version if self.torch is not None else None

    def parsed(self) -> Iterator[tuple[Wheel, WheelInfo]]:
        for wheel in self.wheels:
            if wheel.info is not None:
                yield wheel, wheel.info

    def violation(
        self, field: str, expected: str, found: str, fix: str, severity: Severity = "error"
    ) -> Violation:
        return Violation(
            cell=self.cell.id, field=field, expected=expected, found=found, fix=fix,
            severity=severity,
        )


def platform_name(cell: Cell) -> str:
    return cell.spec.titled(cell.platform_version)
