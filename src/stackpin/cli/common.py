"""Options and helpers shared by the verbs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from stackpin.errors import ConfigurationError
from stackpin.matrix import Cell, Variant, find_cell, load_cells

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CELL = "cpu-bookworm-torch2130-py311"


def project_root() -> Path:
    """The folder holding pinning/: the current directory or the nearest parent with one."""
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / "pinning").is_dir():
            return folder
    return here


def matrix_files(root: Path) -> list[Path]:
    return sorted((root / "pinning").glob("*.toml"))


def all_cells(root: Path | None = None) -> dict[str, Cell]:
    base = root or project_root()
    return load_cells(matrix_files(base))


def cell_by_id(cell_id: str, root: Path | None = None) -> Cell:
    return find_cell(all_cells(root), cell_id)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(
        func
    )


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def selected_variants(cell: Cell, choice: str) -> tuple[Variant, ...]:
    """The variants a --variant choice means for a cell ('all' = every one it builds)."""
    if choice == "all":
        return cell.variants
    if choice not in cell.variants:
        msg = f"cell '{cell.id}' builds {', '.join(cell.variants)}, not '{choice}'"
        raise ConfigurationError(msg + "; pick one of those or --variant all")
    return tuple(v for v in cell.variants if v == choice)
