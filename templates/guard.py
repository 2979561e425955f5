"""Build-time guard run inside the install stage: fail the build when the environment
is not the pinned one. Standard library only: it runs before anything is trusted. The
vendor boundary and the name rule are verify's own (verify/stackpin_verify/boundary.py,
copied beside this file as boundary.py: one rule for the build and for L0.boundary).

Exit 0 when every check holds; otherwise one line per broken check on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import boundary

_OPS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def satisfies(version: str, constraint: str) -> bool:
    """A small PEP 440 subset (release numbers and the six comparison operators)."""
    for clause in filter(None, (c.strip() for c in constraint.split(","))):
        match = re.fullmatch(r"(<=|>=|==|!=|<|>)\s*([0-9][0-9.]*)", clause)
        if match is None:
            msg = f"guard: cannot read numpy constraint {constraint!r}"
            raise SystemExit(msg)
        left, right = _pad(_release(version), _release(match.group(2)))
        if not _OPS[match.group(1)](left, right):
            return False
    return True


def problems(python_tag: str, torch_pin: str, numpy_constraint: str) -> list[str]:
    found = []
    running = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if running != python_tag:
        found.append(f"python is {running}, the cell pins {python_tag}")
    torch = metadata.version("torch")
    if torch != torch_pin:
        found.append(f"torch is {torch}, the cell pins {torch_pin} (a wheel was swapped)")
    try:
        numpy = metadata.version("numpy")
    except metadata.PackageNotFoundError:
        numpy = ""
    if numpy and not satisfies(numpy, numpy_constraint):
        found.append(f"numpy is {numpy}, the cell requires numpy{numpy_constraint}")
    return found


def installed_versions() -> dict[str, str]:
    """Every distribution in this environment by its canonical name (PEP 503)."""
    return {boundary.canonical_name(d.metadata["Name"]): d.version
            for d in metadata.distributions()}


def boundary_problems(image: dict[str, Any], installed: dict[str, str]) -> list[str]:
    """The vendor boundary of image.json: nothing excluded, every provided one the vendor's."""
    return boundary.boundary_problems(
        image.get("provided", {}), image.get("excluded", {}),
        lambda name: installed.get(boundary.canonical_name(name)))


_MISSING = re.compile(r"^(\S+) \S+ requires (\S+?),? which is not installed\.?$")


def pip_check_problems(pip_check_output: str, dropped: set[tuple[str, str]]) -> list[str]:
    """pip check's complaints, less the requirements the cell drops on purpose.

    A dropped requirement (matrix ``dropped``: this distribution runs without that one,
    installed --no-deps) is expected to be missing; anything else pip check reports,
    including the same requirement of another distribution, fails the build.
    """
    found = []
    for line in pip_check_output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        match = _MISSING.match(line)
        names = (boundary.canonical_name(match.group(1)), boundary.canonical_name(match.group(2))
                 ) if match else None
        if names in dropped:
            continue
        found.append(f"pip check: {line}")
    return found


def dropped_edges(image: dict[str, Any]) -> set[tuple[str, str]]:
    return {(boundary.canonical_name(d["of"]), boundary.canonical_name(d["requirement"]))
            for d in image.get("dropped", [])}


def env_script_problems(script: str) -> list[str]:
    """The cell's env script must have been sourced in this build step: the same rule as
    verify's L0.dtk_env (dtk_env.py, copied beside this file by the Dockerfile)."""
    import dtk_env  # only images with an env script carry it

    try:
        exported = dtk_env.exported_by(dtk_env.source_script(script), dtk_env.clean_shell())
    except dtk_env.SourceError as exc:
        return [str(exc)]
    reason = dtk_env.judge_sourced(script, exported, os.environ)
    return [f"this build step did not source the env script: {reason}"] if reason else []


def run_pip_check() -> str:
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True,
                          text=True, check=False)
    return done.stdout + done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", required=True, help="CPython tag, e.g. cp311")
    parser.add_argument("--torch", required=True, help="exact torch version with local label")
    parser.add_argument("--numpy", required=True, help="numpy constraint, e.g. <2")
    parser.add_argument("--boundary", metavar="IMAGE_JSON",
                        help="check the vendor boundary (provided, excluded) of image.json and "
                             "run pip check less its dropped requirements")
    parser.add_argument("--env-script", metavar="SCRIPT",
                        help="the cell's env script (DTK env.sh): this step must have sourced it")
    args = parser.parse_args()
    found = env_script_problems(args.env_script) if args.env_script else []
    found += problems(args.python, args.torch, args.numpy)
    if args.boundary:
        image = json.loads(Path(args.boundary).read_text(encoding="utf-8"))
        found += boundary_problems(image, installed_versions())
        found += pip_check_problems(run_pip_check(), dropped_edges(image))
    for line in found:
        print(f"stackpin guard: {line}", file=sys.stderr)
    if found:
        return 1
    print(f"stackpin guard: python {args.python}, torch {args.torch}, numpy{args.numpy}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
