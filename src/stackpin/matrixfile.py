"""Read matrix files (``pinning/*.toml``) into cells, refusing what no matrix holds.

The file is read bounded (a regular UTF-8 file of at most MAX_MATRIX_BYTES, nested at most
MAX_DEPTH, every key, string and integer within bounds) before the TOML is decoded into the
declarations of ``stackpin.matrix``; decoding collects every problem of the file (types,
unknown keys, then each cell's values: ``stackpin.matrix_safety``, the service, the shims)
instead of stopping at the first, so a release engineer fixes a matrix in one pass.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stackpin.compat import compat_problems
from stackpin.declared import Decoder, Problem, did_you_mean
from stackpin.errors import ConfigurationError
from stackpin.matrix import SCHEMA_VERSION, Cell, Matrix, pinned_wheels
from stackpin.matrix_safety import cell_problems, duplicate_ids
from stackpin.servicespec import service_problems
from stackpin.untrusted import MAX_DEPTH, depth, read_bounded, shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

MAX_MATRIX_BYTES = 4 << 20
# Bounds of every key and value of a matrix file (parse_toml): far above any real setting.
MAX_VALUE_CHARS = 4096
MAX_INT = 1 << 63


def _structural_problems(matrix: Matrix) -> list[Problem]:
    """Rules about single values that the type system cannot express."""
    problems: list[Problem] = []
    if matrix.schema_version != SCHEMA_VERSION:
        problems.append(
            Problem("schema_version", f"this stackpin reads version {SCHEMA_VERSION}")
        )
    for cell in matrix.cells.values():
        problems += cell_problems_of(cell)
        if cell.rehearsal is not None:
            # A stand-in is never written by hand: only derivation marks what it is.
            problems.append(Problem(f"cells.{cell.id}.rehearsal", "a rehearsal cell is derived "
                                    "from its real cell, never declared: `stackpin rehearsal "
                                    "list` shows them"))
    return problems


def cell_problems_of(cell: Cell) -> list[Problem]:
    """Every problem of one decoded cell's values (shapes, bounds, safe names).

    A cell with one is never resolved, locked or built: the verbs that act on a cell ask
    this before anything runs (``stackpin.checks.require_resolvable``).
    """
    problems: list[Problem] = []
    where = f"cells.{cell.id}"
    base = cell.base
    if bool(base.image) == (base.bootstrap is not None):
        problems.append(Problem(f"{where}.base", "set exactly one of 'image' or 'bootstrap'"))
    if base.digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", base.digest):
        problems.append(Problem(f"{where}.base.digest", "expected sha256:<64 hex digits>"))
    for wheel_path, wheel in pinned_wheels(cell):
        if wheel.sha256 and not re.fullmatch(r"[0-9a-f]{64}", wheel.sha256):
            problems.append(Problem(f"{where}.{wheel_path}.sha256", "expected 64 hex digits"))
    if not cell.variants:
        problems.append(Problem(f"{where}.variants", "list at least one variant"))
    if cell.service is not None:
        problems += [Problem(f"{where}.service.{key}", message)
                     for key, message in service_problems(cell.service)]
    problems += [Problem(f"{where}.{key}", message)
                 for key, message in compat_problems(cell.compat, cell.stack)]
    problems += [Problem(path, message)
                 for path, message in cell_problems(cell, pinned_wheels(cell))]
    return problems


def decode_matrix_lenient(data: Mapping[str, Any]) -> tuple[Matrix | None, list[Problem]]:
    """Decode as much as possible and return every problem found.

    An unknown key is a problem but does not stop its table from decoding, so ``matrix
    check`` can report a misspelled key together with the cross-check violations of the
    same cell in one run.
    """
    if oversized := _oversized(data):  # parse_toml refuses it first; other callers here
        return None, [Problem("matrix", f"{oversized}; no setting of a matrix is that large")]
    decoder = Decoder()
    matrix = decoder.decode(Matrix, dict(data), "")
    problems = decoder.problems
    if isinstance(matrix, Matrix):
        return matrix, problems + _structural_problems(matrix)
    return None, problems


def parse_toml(path: Path) -> dict[str, Any]:
    """Read a matrix file's TOML, with errors that name the file and how to fix it.

    The file must be a regular UTF-8 file of at most MAX_MATRIX_BYTES, nested at most
    MAX_DEPTH levels: a directory, /dev/zero or a nesting bomb is one line, not a hang.
    """
    if not path.exists():
        msg = f"{shown(path)}: no such matrix file; list the shipped ones with 'ls pinning/*.toml'"
        raise ConfigurationError(msg)
    data = read_bounded(path, limit=MAX_MATRIX_BYTES, what="matrix file", error=ConfigurationError)
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        msg = f"{shown(path)}: not UTF-8 (byte {exc.start}); save the matrix as UTF-8"
        raise ConfigurationError(msg) from None
    except tomllib.TOMLDecodeError as exc:
        msg = f"{shown(path)}: not valid TOML ({shown(exc)}); fix the syntax at that line"
        raise ConfigurationError(msg) from None
    except RecursionError:
        document = None
    except ValueError:  # tomllib's int() of a literal past Python's 4300-digit limit
        msg = f"{shown(path)}: an integer with thousands of digits: not a matrix"
        raise ConfigurationError(msg) from None
    if document is None or depth(document) > MAX_DEPTH:
        msg = f"{shown(path)}: nested more than {MAX_DEPTH} levels deep: not a matrix"
        raise ConfigurationError(msg)
    if oversized := _oversized(document):
        msg = f"{shown(path)}: {oversized}; no setting of a matrix is that large"
        raise ConfigurationError(msg)
    return document


def _oversized(document: Mapping[str, Any]) -> str | None:
    """The first key, string or integer beyond the matrix bounds, said in a few words.

    Bounding every value here, before decoding, is what lets every later parse (versions,
    tags, labels, ports) stay within Python's and packaging's limits: no string can hold
    a number near the 4300-digit conversion limit, no integer overflows a C long.
    """
    stack: list[Any] = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key in item:
                if len(key) > MAX_VALUE_CHARS:
                    return f"a key of {len(key)} characters ({shown(key, limit=40)})"
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and len(item) > MAX_VALUE_CHARS:
            return f"a string of {len(item)} characters ({shown(item, limit=40)})"
        elif isinstance(item, int) and not -MAX_INT <= item < MAX_INT:
            return f"an integer of {len(str(abs(item)))} digits"
    return None


def decode_matrix(data: Mapping[str, Any], *, source: str) -> Matrix:
    """Decode parsed TOML into a Matrix, or raise with every problem of the file."""
    matrix, problems = decode_matrix_lenient(data)
    if problems:
        lines = [f"{source}: {p}" for p in problems]
        msg = f"{source}: {len(problems)} problem(s) in the matrix; first: {problems[0]}"
        raise ConfigurationError(
            msg,
            details=lines,
        )
    assert isinstance(matrix, Matrix)
    return matrix


def load_matrix(path: Path) -> Matrix:
    """Read and decode one matrix file."""
    return decode_matrix(parse_toml(path), source=str(path))


def load_cells(paths: list[Path]) -> dict[str, Cell]:
    """Every cell of several matrix files by id; a duplicate id is a configuration error."""
    cells: dict[str, Cell] = {}
    files: list[tuple[str, list[str]]] = []
    for path in paths:
        matrix = load_matrix(path)
        files.append((str(path), list(matrix.cells)))
        cells.update(matrix.cells)
    duplicates = duplicate_ids(files)
    if duplicates:
        source, (where, message) = duplicates[0]
        msg = f"{shown(source)}: {where}: {message}"
        raise ConfigurationError(msg)
    return cells


def find_cell(cells: Mapping[str, Cell], cell_id: str) -> Cell:
    """The cell with this id, or a ConfigurationError that suggests the closest id."""
    if cell_id in cells:
        return cells[cell_id]
    hint = did_you_mean(cell_id, list(cells))
    msg = f"no cell '{cell_id}'{hint}; 'stackpin matrix list' shows every cell"
    raise ConfigurationError(msg)
