"""Compatibility shims, declared per cell: small bridges over named upstream defects.

A shim is data in the cell (``[cells.X.compat.<id>]``: the defect in one line, the
distribution and exact version it was written for, the module whose import applies it) and
one file, templates/compat/<id>.py, that lands in the image as /opt/stackpin/compat/<id>.py
beside the hook that applies it (templates/compat/hook.py, started by a .pth file in every
interpreter). A shim is tied to the version it bridges: when the cell pins another version,
``matrix check`` asks whether the defect is still there instead of shipping the bridge blind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from stackpin.declared import doc
from stackpin.errors import ConfigurationError

SHIM_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
IN_IMAGE = "/opt/stackpin/compat"
PTH_NAME = "stackpin-compat.pth"


@dataclass(frozen=True, kw_only=True)
class Compat:
    """One compatibility shim: /opt/stackpin/compat/<id>.py, applied when ``module`` loads."""

    id: str = field(metadata=doc("Shim id (the table key): templates/compat/<id>.py.",
                                 from_key=True))
    defect: str = field(metadata=doc("One line: the upstream defect the shim bridges."))
    dist: str = field(metadata=doc("The distribution that carries the defect, e.g. trl."))
    version: str = field(
        metadata=doc("The exact version it was written for; the cell's stack must pin it.")
    )
    module: str = field(metadata=doc("The module whose import applies the shim."))


def compat_problems(shims: Mapping[str, Compat], stack: Mapping[str, str]
                    ) -> list[tuple[str, str]]:
    """(key under the cell, message) for each of a cell's shims that does not fit the cell's
    ``stack`` pins."""
    problems: list[tuple[str, str]] = []
    pins = {canonicalize_name(name): version for name, version in stack.items()}
    for shim in shims.values():
        where = f"compat.{shim.id}"
        if not SHIM_ID.fullmatch(shim.id):
            problems.append((where, "a shim id is lower-case words joined by '-'"))
        if not MODULE.fullmatch(shim.module):
            problems.append((f"{where}.module", "a dotted module name such as trl.trainer"))
        pinned = pins.get(canonicalize_name(shim.dist))
        if pinned != shim.version:
            problems.append((f"{where}.version", (
                f"the shim bridges {shim.dist} {shim.version}, the cell pins "
                f"{shim.dist} {pinned or 'nothing'}: check whether the defect is still there, "
                "then set version to the pin or remove the shim")))
    return problems


def compat_files(shims: Mapping[str, Compat], *, python_tag: str,
                 sources: Mapping[str, str]) -> dict[str, str]:
    """The build context files of a cell's shims (empty without any), under stackpin/.

    The .pth file goes into the venv's site-packages (the install stage copies stackpin/
    over /opt/stackpin), so every interpreter of the image starts the hook. ``sources``:
    the templates folder's files by path (render's Sources), compat/<id>.py among them.
    """
    if not shims:
        return {}
    files = {"stackpin/compat/hook.py": _template(sources, "hook")}
    for shim_id in sorted(shims):
        files[f"stackpin/compat/{shim_id}.py"] = _template(sources, shim_id)
    declared = {s.id: {"defect": s.defect, "dist": s.dist, "version": s.version,
                       "module": s.module} for s in shims.values()}
    files["stackpin/compat/shims.json"] = json.dumps(declared, indent=2, sort_keys=True) + "\n"
    python = f"{python_tag[2]}.{python_tag[3:]}"  # cp311 -> 3.11
    site = f"stackpin/venv/lib/python{python}/site-packages/{PTH_NAME}"
    files[site] = f"import runpy; runpy.run_path('{IN_IMAGE}/hook.py')\n"
    return files


def _template(sources: Mapping[str, str], name: str) -> str:
    path = f"compat/{name}.py"
    if path not in sources:
        msg = (f"compat shim '{name}' has no file templates/{path}: add it, or remove the shim "
               "from the cell")
        raise ConfigurationError(msg)
    return sources[path]
