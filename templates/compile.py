"""Byte-compile what one install step installed, inside that step (its own image layer).

Run by the environment's interpreter right after a layer's install, in the same step:
``python compile.py REQUIREMENTS`` (the layer's hash-locked requirements file; a second
argument names another site-packages, for tests). Both builders run it, from the build
context's tools/ (mounted, or copied into the install stage): it never reaches the image.
Every ``name==version`` line names a distribution this step installed; its RECORD lists
its files, and each ``.py`` among them under site-packages is compiled to an
unchecked-hash pyc: no timestamp in it (the same bytes on every build) and never
re-validated (the environment is immutable once built).

Nothing of a lower layer is touched: an installer's own compile pass walks the whole
site-packages and, for hash-based pycs, rewrites every pyc there (uv forces it), which
would copy torch's bytecode up into the stack's layer. So each layer carries exactly its
own bytecode, and a pin change moves no bytecode of the layers below it.

Files written for a newer Python (torch's py312_intrinsics.py) are counted, not fatal:
this interpreter never imports them, and pip's own compile step skips them the same way.
Standard library only. Exit 0 when compiled; 1 when a listed distribution is missing or
has no RECORD (one line on stderr each; versions are the guard's to judge, after the
installs); 2 usage.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import py_compile
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def pinned(requirements: str) -> list[tuple[str, str]]:
    """The (name, version) of every ``name==version ...`` line; comments and blanks skipped."""
    pins = []
    for line in requirements.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and (found := _PIN.match(line)):
            pins.append((found.group(1), found.group(2)))
    return pins


def modules_of(pins: list[tuple[str, str]], site: Path) -> tuple[list[str], list[str]]:
    """The .py files the pinned distributions installed under ``site``, and the problems
    (a distribution missing, or without RECORD)."""
    files: set[str] = set()
    problems = []
    found = {_normal(d.metadata["Name"]): d for d in metadata.distributions(path=[str(site)])}
    for name, version in pins:
        dist = found.get(_normal(name))
        if dist is None:
            problems.append(f"{name} {version} is not installed in {site}")
            continue
        if dist.files is None:
            problems.append(f"{name} {version} has no RECORD: cannot tell its files")
            continue
        for entry in dist.files:
            path = Path(os.path.normpath(site / entry))
            if path.suffix == ".py" and path.is_relative_to(site) and path.is_file():
                files.add(str(path))
    return sorted(files), problems


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def compile_one(path: str) -> str:
    """Compile one file; return its path when this interpreter cannot parse it."""
    try:
        py_compile.compile(
            path, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
        )
    except py_compile.PyCompileError as exc:
        if isinstance(exc.exc_value, SyntaxError):
            return path
        raise
    return ""


def compile_files(files: list[str], workers: int) -> list[str]:
    """Compile every file on ``workers`` processes; the ones skipped (newer syntax).

    A pyc's bytes depend on its source and this interpreter only, not on the process or
    the order: two builds with any number of workers write the same files (tested)."""
    if workers <= 1 or len(files) < 2:
        return [p for p in map(compile_one, files) if p]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return [p for p in pool.map(compile_one, files, chunksize=32) if p]


def site_packages() -> Path:
    """This interpreter's site-packages (the venv's, when run by the venv's python)."""
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: compile.py REQUIREMENTS [SITE_PACKAGES]", file=sys.stderr)
        return 2
    site = Path(argv[1]) if len(argv) == 2 else site_packages()
    pins = pinned(Path(argv[0]).read_text(encoding="utf-8"))
    files, problems = modules_of(pins, site.resolve())
    for line in problems:
        print(f"stackpin compile: {line}", file=sys.stderr)
    if problems:
        return 1
    skipped = compile_files(files, os.cpu_count() or 1)
    print(f"stackpin compile: {len(files) - len(skipped)} modules of {len(pins)} "
          f"distributions, {len(skipped)} skipped (syntax of a newer Python)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
