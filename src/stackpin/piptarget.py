"""pip aimed at a cell's target (CPython, ABI, glibc floor), never at the host, and the
command seam: a ``Runner`` (argv, line callback) -> exit code that tests replace, as tox
does with its executor; and what pip's installation report says of a file's hash."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

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


def report_argv(cell: Cell, python: str, report: Path, target: Path,
                requirements: Path, *, deps: bool) -> list[str]:
    """pip's own resolver for the cell's CPython, ABI and platform; nothing installed."""
    argv = [
        # Not --quiet: pip's "The conflict is caused by" block is what conflicts quote.
        python, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--disable-pip-version-check", "--progress-bar", "off", "--only-binary=:all:",
        "--report", str(report), "--target", str(target),
        "--implementation", "cp", "--python-version", python_version(cell),
        "--abi", cell.python, "--abi", "abi3", "--abi", "none",
    ]
    for tag in target_platforms(cell):
        argv += ["--platform", tag]
    if not deps:
        argv.append("--no-deps")
    return [*argv, "-r", str(requirements)]


def report_sha256(download_info: Mapping[str, Any]) -> str:
    """The sha256 pip recorded: ``archive_info.hashes`` (pip >= 23.1 for every link) or
    the legacy single ``hash`` ("sha256=..."), all that pip 23.0 (Debian 12's venv) writes
    for a find-links file."""
    archive = download_info.get("archive_info", {})
    if sha256 := archive.get("hashes", {}).get("sha256", ""):
        return str(sha256)
    algorithm, _, value = str(archive.get("hash", "")).partition("=")
    return value if algorithm == "sha256" else ""
