"""``stackpin matrix``: list cells, check them for consistency, print the JSON Schema."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import click

from stackpin import tools
from stackpin.boundary import GUIDE, Conflict
from stackpin.checks import Violation, check_cells
from stackpin.cli.common import (
    ExistingPath,
    all_cells,
    echo_json,
    json_option,
    project_layout,
)
from stackpin.declared import Problem
from stackpin.errors import ConfigurationError, ValidationError
from stackpin.lock import read_lock, stale_reason
from stackpin.matrix import Cell, json_schema, reference_rows
from stackpin.matrix_safety import duplicate_ids
from stackpin.matrixfile import decode_matrix_lenient, parse_toml
from stackpin.resolve import Pip, ResolutionFailed, resolution_key, resolve_cell


@click.group(name="matrix")
def command() -> None:
    """Inspect and check the pinned ABI matrices (pinning/*.toml)."""


@command.command(name="list")
@json_option
def list_cells(as_json: bool) -> None:
    """List every cell: id, platform, arch, CPython, torch wheel, variants."""
    cells = all_cells()
    if as_json:
        echo_json([_summary(c) for c in cells.values()])
        return
    for cell in cells.values():
        arch = ",".join(cell.arch) or "-"
        variants = ",".join(cell.variants)
        click.echo(f"{cell.id:32} {cell.platform:5} {arch:8} {cell.python:6} {variants}")


def _summary(cell: Cell) -> dict[str, object]:
    return {
        "id": cell.id,
        "platform": cell.platform,
        "platform_version": cell.platform_version,
        "arch": list(cell.arch),
        "python": cell.python,
        "variants": list(cell.variants),
        "torch": cell.torch.filename,
        "description": cell.description,
    }


@command.command(name="check")
@click.argument("files", nargs=-1, type=ExistingPath("file"))
@click.option("--no-resolve", is_flag=True,
              help="Skip the dependency resolution (only the rules on the matrix itself).")
@json_option
def check(files: tuple[Path, ...], no_resolve: bool, as_json: bool) -> None:
    """Check matrices before any build: keys, wheel tags, vendor labels, constraints.

    FILES default to pinning/*.toml. Every problem of every file is reported, one line
    each (cell, field, expected vs found, how to fix). Unpinned sha256 values are
    warnings: rendering allows them, a build refuses them.

    Each cell is then resolved with pip's resolver, the vendor boundary respected
    (provided distributions stand in as placeholders, excluded ones may not appear):
    one line per conflict. A cell whose committed lock is current is not resolved again;
    results are cached by the resolution's inputs, so a second run works offline.

    A cell with a malformed setting or a violation is never resolved. Exit 0 when only
    warnings remain, 2 when a FILE is missing or not a regular file, 3 on unreadable or
    malformed files, 4 on consistency violations or resolution conflicts.
    """
    paths = list(files) or project_layout().matrix_files()
    problems, cells, blocked = _read_matrices(paths)
    violations = check_cells(cells)
    broken = {v.cell for v in violations if v.severity == "error"}
    # Only a cell with no problem and no violation reaches pip: a malformed one could name
    # a URL, a path or an unbounded version, and resolving it would act on that.
    resolvable = [c for c in cells if id(c) not in blocked and c.id not in broken]
    conflicts = [] if no_resolve else resolution_conflicts(
        resolvable, project_layout().root, Pip())
    errors = [v for v in violations if v.severity == "error"]
    warnings = [v for v in violations if v.severity != "error"]
    if as_json:
        echo_json(_json_result(paths, cells, problems, violations, conflicts))
    else:
        _print_result(paths, cells, problems, [*map(str, errors), *map(str, conflicts)],
                      warnings)
    if problems:
        msg = f"{len(problems)} malformed setting(s) and {len(errors)} violation(s); see above"
        raise ConfigurationError(msg)
    if errors or conflicts:
        msg_0 = (f"{len(errors)} violation(s) and {len(conflicts)} resolution conflict(s) in "
                 f"{len(cells)} cell(s); see above")
        raise ValidationError(msg_0)


def _read_matrices(paths: list[Path]) -> tuple[list[tuple[str, Problem]], list[Cell], set[int]]:
    """Every (file, problem), every decoded cell, and the id() of each cell a problem is
    about (those are never resolved)."""
    problems: list[tuple[str, Problem]] = []
    cells: list[Cell] = []
    declared: list[tuple[str, list[str]]] = []
    blocked: set[int] = set()
    for path in paths:
        matrix, found = decode_matrix_lenient(parse_toml(path))
        problems += [(str(path), p) for p in found]
        if matrix is not None:
            cells += matrix.cells.values()
            declared.append((str(path), list(matrix.cells)))
            blocked |= {id(c) for c in _with_problems(matrix.cells.values(), found)}
    for source, (where, message) in duplicate_ids(declared):
        problems.append((source, Problem(where, message)))
        blocked |= {id(c) for c in cells if f"cells.{c.id}" == where}
    return problems, cells, blocked


def _with_problems(cells: Iterable[Cell], found: list[Problem]) -> list[Cell]:
    """The cells a file's problems are about; a problem outside every cell (the schema
    version, say) puts the whole file in doubt, so it is about all of them."""
    about = {id(cell): (cell, _about(cell, found)) for cell in cells}
    covered = {p for _cell, problems in about.values() for p in problems}
    if any(p not in covered for p in found):
        return [cell for cell, _problems in about.values()]
    return [cell for cell, problems in about.values() if problems]


def _about(cell: Cell, found: list[Problem]) -> list[Problem]:
    where = f"cells.{cell.id}"
    return [p for p in found if p.path == where or p.path.startswith((f"{where}.", f"{where}["))]


def resolution_conflicts(cells: list[Cell], root: Path, pip: Pip) -> list[Conflict]:
    """Resolve each cell (pip, cached by its inputs); a current lock already is a resolution."""
    found: list[Conflict] = []
    for cell in cells:
        lock = read_lock(root, cell.id)
        if lock is not None and stale_reason(lock, cell) is None and (
            lock.resolution_key == resolution_key(cell)
        ):
            continue
        try:
            found += resolve_cell(cell, pip).conflicts
        except ResolutionFailed as failed:
            found.append(failed.conflict)
    return found


def _json_result(
    paths: list[Path],
    cells: list[Cell],
    problems: list[tuple[str, Problem]],
    violations: list[Violation],
    conflicts: list[Conflict],
) -> dict[str, object]:
    return {
        "files": [str(p) for p in paths],
        "cells": [c.id for c in cells],
        "ok": not problems and not conflicts and all(v.severity != "error" for v in violations),
        "conflicts": [{"cell": c.cell, "message": c.message} for c in conflicts],
        "problems": [{"file": f, "path": p.path, "message": p.message} for f, p in problems],
        "violations": [
            {
                "cell": v.cell,
                "field": v.field,
                "expected": v.expected,
                "found": v.found,
                "fix": v.fix,
                "severity": v.severity,
            }
            for v in violations
        ],
    }


def _print_result(
    paths: list[Path],
    cells: list[Cell],
    problems: list[tuple[str, Problem]],
    errors: list[str],
    warnings: list[Violation],
) -> None:
    for source, problem in problems:
        click.echo(f"ERROR {source}: {problem}")
    for line in errors:
        click.echo(f"ERROR {line}")
    for violation in warnings:
        click.echo(f"WARN  {violation}")
    click.echo(
        f"checked {len(cells)} cell(s) in {len(paths)} file(s): "
        f"{len(problems) + len(errors)} error(s), {len(warnings)} warning(s)"
    )


@command.command(name="schema")
def schema() -> None:
    """Print the JSON Schema of a matrix file (generated from the same declarations)."""
    echo_json(json_schema())


def reference_markdown() -> str:
    """docs/matrix.md: every setting with type, default and help (tests keep it in sync)."""
    lines = [
        "# Matrix reference",
        "",
        "Generated by `stackpin matrix docs` from the same declarations that decode matrices",
        "and produce `stackpin matrix schema`; a test fails when this file is out of date.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for key, kind, default, text in reference_rows():
        lines.append(f"| `{key}` | {kind} | {f'`{default}`' if default else ''} | {text} |")
    return "\n".join(lines) + "\n\n" + GUIDE + "\n" + tools.GUIDE


@command.command(name="docs")
def docs() -> None:
    """Print the Markdown reference of every matrix setting (docs/matrix.md)."""
    click.echo(reference_markdown(), nl=False)
