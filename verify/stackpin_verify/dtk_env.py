"""L0.dtk_env from the real environment (issue 22).

The old check accepted ROCM_PATH or DTK_PATH naming any existing directory, so a stale
script, an empty leftover directory or a base image's inherited variables all passed. Now:

1. the cell's declared script is sourced in a clean shell (``env -i bash -c '. SCRIPT;
   env -0'``) and every variable it exports is compared with this process's: absent
   everywhere means the script was never sourced, a different value means a stale
   environment (search paths: each entry the script puts there must be present);
2. the DTK version in those paths (``/opt/dtk-26.04...``, after resolving symlinks) must be
   the cell's ``platform_version``;
3. the tree must hold what the stack loads: the HIP runtime library, ``hipcc``, ``ld.lld``
   (where ``TRITON_HIP_LLD_PATH`` points, when set) and the device bitcode libraries, each
   missing one named; a tree with nothing in it is an empty leftover directory.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Set by bash itself in any shell, never by the script.
SHELL_OWN = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
# Colon-separated search paths: the process may add entries, never lose the script's.
SEARCH_PATHS = frozenset({"PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "PYTHONPATH"})
# Variables naming the DTK tree, in the order the root is taken from.
ROOT_VARS = ("ROCM_PATH", "DTK_PATH", "HIP_PATH")
SOURCE_TIMEOUT_S = 30
# What the stack loads from the tree: a name and globs relative to its root (DTK keeps the
# ROCm layout; libamdhip64 resolves to libgalaxyhip on DTK, dcu-facts).
REQUIRED = (
    (
        "HIP runtime library",
        ("lib/libamdhip64.so*", "lib/libgalaxyhip.so*", "hip/lib/libamdhip64.so*"),
    ),
    ("hipcc", ("bin/hipcc", "hip/bin/hipcc")),
    ("ld.lld", ("llvm/bin/ld.lld", "lib/llvm/bin/ld.lld")),
    (
        "device libraries",
        (
            "amdgcn/bitcode/ocml.bc",
            "lib/llvm/amdgcn/bitcode/ocml.bc",
            "llvm/amdgcn/bitcode/ocml.bc",
        ),
    ),
)
_VERSION = re.compile(r"dtk-?(\d{2}\.\d{2}(?:\.\d+)?)", re.IGNORECASE)
_LABEL = re.compile(r"dtk(\d{2})(\d{2})(\d?)(?!\d)")


class SourceError(Exception):
    """The script could not be sourced; the message says why."""


def source_script(script: str) -> dict[str, str]:
    """The variables a clean shell holds after sourcing ``script`` (bash's own left out)."""
    try:
        done = subprocess.run(
            # PATH exported after the script: unexported, bash's own default would not show,
            # and an entry of that default (its ".") would look like one the script added.
            ["env", "-i", "bash", "-c", '. "$0" >/dev/null && export PATH && env -0', script],
            capture_output=True,
            timeout=SOURCE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        msg = f"sourcing {script} in a clean shell failed: {type(exc).__name__}: {exc}"
        raise SourceError(msg) from exc
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        msg = f"sourcing {script} in a clean shell exited {done.returncode}: {' '.join(err[-2:])}"
        raise SourceError(msg)
    return parse_env0(done.stdout)


def parse_env0(raw: bytes) -> dict[str, str]:
    found = {}
    for entry in raw.decode(errors="replace").split("\0"):
        name, sep, value = entry.partition("=")
        if sep and name not in SHELL_OWN:
            found[name] = value
    return found


def clean_shell() -> dict[str, str]:
    """What a clean shell holds before any script (bash's default PATH, no more)."""
    return source_script("/dev/null")


def exported_by(sourced: Mapping[str, str], baseline: Mapping[str, str]) -> dict[str, str]:
    """The variables the script set or changed; of a search path, the entries it added (a
    script extends PATH with the shell's own, which no process need hold as they were)."""
    found = {}
    for name, value in sourced.items():
        if name in SEARCH_PATHS:
            had = set(baseline.get(name, "").split(":"))
            value = ":".join(p for p in value.split(":") if p and p not in had)
            if value:
                found[name] = value
        elif baseline.get(name) != value:
            found[name] = value
    return found


def judge_sourced(
    script: str, exported: Mapping[str, str], environ: Mapping[str, str]
) -> str | None:
    """Never sourced (none of its variables here), stale (here with other values), or ok."""
    if not exported:
        return f"{script} exports no variable in a clean shell: it cannot set up DTK"
    present = [k for k in exported if k in environ and k not in SEARCH_PATHS]
    scalars = [k for k in exported if k not in SEARCH_PATHS]
    if scalars and not present:
        return (
            f"DTK env script {script} was never sourced: none of {', '.join(sorted(scalars))} "
            "is set in this process; source it in the entrypoint"
        )
    stale = []
    for name, want in sorted(exported.items()):
        have = environ.get(name)
        if name in SEARCH_PATHS:
            kept = have.split(":") if have else []
            lost = [p for p in want.split(":") if p and p not in kept]
            if lost:
                stale.append(f"{name} lacks {':'.join(lost)}")
        elif have != want:
            stale.append(f"{name}={have!r}, the script sets {want!r}")
    if stale:
        return (
            f"DTK environment is stale (not what {script} sets now): {'; '.join(stale)}; "
            "source the cell's script again (a base image's or an older DTK's variables)"
        )
    return None


def cell_dtk_version(platform_version: str, torch_pin: str) -> str | None:
    """The cell's DTK release: image.json's platform_version, else the torch pin's label
    (``+das.opt1.dtk2604`` -> 26.04) for images written before that field."""
    if platform_version:
        return platform_version
    match = _LABEL.search(torch_pin)
    if not match:
        return None
    major, minor, patch = match.groups()
    return f"{major}.{minor}" + (f".{patch}" if patch else "")


def versions_in_paths(exported: Mapping[str, str]) -> dict[str, str]:
    """The DTK version each root variable's path names (symlinks resolved first, since
    /opt/dtk usually points at /opt/dtk-<version>-...; else the name itself)."""
    found = {}
    for name in ROOT_VARS:
        value = exported.get(name)
        if not value:
            continue
        match = _VERSION.search(os.path.realpath(value)) or _VERSION.search(value)
        if match:
            found[name] = match.group(1)
    return found


def judge_version(found: Mapping[str, str], cell: str | None) -> str | None:
    if cell is None:
        return None
    wrong = [f"{name} names DTK {v}" for name, v in sorted(found.items()) if not _same(v, cell)]
    if wrong:
        return f"{'; '.join(wrong)}, the cell's DTK is {cell}: the tree is another release's"
    return None


def _same(found: str, cell: str) -> bool:
    """26.04 matches 26.04 and 26.04.1 (a patch release of the same DTK); 24.04 does not."""
    return found == cell or found.startswith(cell + ".") or cell.startswith(found + ".")


@dataclass(frozen=True)
class TreeReport:
    root: str
    missing: tuple[str, ...]
    empty: bool


def inspect_tree(root: str, lld_path: str | None) -> TreeReport:
    """Which of REQUIRED the tree at ``root`` lacks; ld.lld is looked for where
    TRITON_HIP_LLD_PATH points when it is set (the file triton links with)."""
    base = Path(root)
    empty = not base.is_dir() or not any(base.iterdir())
    missing = []
    for what, patterns in REQUIRED:
        if what == "ld.lld" and lld_path:
            if not (Path(lld_path).name == "ld.lld" and Path(lld_path).is_file()):
                missing.append(f"ld.lld (TRITON_HIP_LLD_PATH={lld_path} is no file named ld.lld)")
            continue
        if not any(any(base.glob(pattern)) for pattern in patterns):
            missing.append(f"{what} ({' or '.join(patterns)})")
    return TreeReport(root=root, missing=tuple(missing), empty=empty)


def judge_tree(tree: TreeReport | None) -> str | None:
    if tree is None:
        return f"the script sets none of {', '.join(ROOT_VARS)}: no DTK tree to check"
    if tree.empty:
        return f"DTK tree {tree.root} is empty or not a directory (a leftover, not an install)"
    if tree.missing:
        return f"DTK tree {tree.root} lacks: {'; '.join(tree.missing)}"
    return None


def tree_root(exported: Mapping[str, str]) -> str | None:
    return next((exported[v] for v in ROOT_VARS if exported.get(v)), None)


def judge_all(reasons: Sequence[str | None]) -> str | None:
    found = [r for r in reasons if r]
    return "; ".join(found) if found else None


def check(
    script: str, environ: Mapping[str, str], cell_version: str | None
) -> tuple[dict[str, object], str | None]:
    """Source ``script`` and judge the process's environment and the tree against it:
    (metrics, reason or None). Raises SourceError when the script cannot be sourced."""
    exported = exported_by(source_script(script), clean_shell())
    root = tree_root(exported)
    lld = exported.get("TRITON_HIP_LLD_PATH") or environ.get("TRITON_HIP_LLD_PATH")
    tree = inspect_tree(root, lld) if root else None
    found = versions_in_paths(exported)
    metrics: dict[str, object] = {
        "env_script": script,
        "exported": sorted(exported),
        "root": root,
        "dtk_version_cell": cell_version,
        "dtk_version_paths": found,
        "missing": list(tree.missing) if tree else None,
    }
    reason = judge_all(
        [judge_sourced(script, exported, environ), judge_version(found, cell_version),
         judge_tree(tree)]
    )
    return metrics, reason
