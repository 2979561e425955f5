"""``stackpin matrix``: list cells, check them for consistency, print the JSON Schema."""

from __future__ import annotations

from pathlib import Path

import click

from stackpin.checks import Violation, check_cells
from stackpin.cli.common import all_cells, echo_json, json_option, matrix_files, project_root
from stackpin.errors import ConfigurationError, ValidationError
from stackpin.matrix import Cell, Problem, decode_matrix_lenient, json_schema, parse_toml


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
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@json_option
def check(files: tuple[Path, ...], as_json: bool) -> None:
    """Check matrices before any build: keys, wheel tags, vendor labels, constraints.

    FILES default to pinning/*.toml. Every problem of every file is reported, one line
    each (cell, field, expected vs found, how to fix). Unpinned sha256 values are
    warnings: rendering allows them, a build refuses them.

    Exit 0 when only warnings remain, 3 on unreadable or malformed files, 4 on
    consistency violations.
    """
    paths = list(files) or matrix_files(project_root())
    problems: list[tuple[str, Problem]] = []
    cells: list[Cell] = []
    for path in paths:
        matrix, found = decode_matrix_lenient(parse_toml(path))
        problems += [(str(path), p) for p in found]
        if matrix is not None:
            cells += matrix.cells.values()
    violations = check_cells(cells)
    errors = [v for v in violations if v.severity == "error"]
    warnings = [v for v in violations if v.severity != "error"]
    if as_json:
        echo_json(_json_result(paths, cells, problems, violations))
    else:
        _print_result(paths, cells, problems, errors, warnings)
    if problems:
        msg = f"{len(problems)} malformed setting(s) and {len(errors)} violation(s); see above"
        raise ConfigurationError(msg)
    if errors:
        msg_0 = f"{len(errors)} violation(s) in {len(cells)} cell(s); see above"
        raise ValidationError(msg_0)


def _json_result(
    paths: list[Path],
    cells: list[Cell],
    problems: list[tuple[str, Problem]],
    violations: list[Violation],
) -> dict[str, object]:
    return {
        "files": [str(p) for p in paths],
        "cells": [c.id for c in cells],
        "ok": not problems and all(v.severity != "error" for v in violations),
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
    errors: list[Violation],
    warnings: list[Violation],
) -> None:
    for source, problem in problems:
        click.echo(f"ERROR {source}: {problem}")
    for violation in errors:
        click.echo(f"ERROR {violation}")
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
