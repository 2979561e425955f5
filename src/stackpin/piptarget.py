"""pip aimed at a cell's target (CPython, ABI, glibc floor), never at the host, and the
command seam: a ``Runner`` (argv, line callback) -> exit code that tests replace, as tox
does with its executor."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from stackpin.matrix import Cell

Runner = Callable[[list[str], Callable[[str], None]], int]
LineSink = Callable[[str], None]


def target_platforms(cell: Cell) -> list[str]:
    """pip --platform values for the cell: every manylinux tag its glibc floor admits.

    pip matches --platform tags literally, so each manylinux_2_N up to the cell's glibc is
    listed along with the legacy aliases.
    """
    arch = cell.cpu_arch
    major, minor = (int(p) for p in cell.glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
    tags += [f"{name}_{arch}" for name, floor in legacy.items() if floor <= minor]
    return tags


def python_version(cell: Cell) -> str:
    digits = cell.python.removeprefix("cp")
    return f"{digits[0]}.{digits[1:]}"


def subprocess_runner(argv: list[str], on_line: LineSink) -> int:
    """Run a command, passing each output line on as it arrives."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        return proc.wait()
