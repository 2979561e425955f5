"""The stand-in vendor tree of a rehearsal base, per platform (pure: data in, tar bytes out).

A DTK or ROCm image starts from the vendor's base image, which holds the vendor tree
(``/opt/dtk-26.04...`` behind ``/opt/dtk``, ROCm's ``/opt/rocm...``), its ``env.sh`` and
the device tools. None of that can reach this machine, so a rehearsal base carries a tree at
the same paths whose every file says it is a stand-in, holding exactly what the images and
``L0.dtk_env`` look for: the HIP runtime library, ``hipcc``, the device bitcode libraries,
``llvm/bin/ld.lld`` (a link to Debian's real linker, installed in the base) and the device
tools the site scripts call (``hy-smi``, ``rocm-smi``). Nothing here runs a kernel.

The platform facts live in each platform's spec (``PlatformSpec.vendor_tree``).
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass

from stackpin import platforms
from stackpin.matrix import Cell
from stackpin.platforms.spec import TreeFacts

# The PATH of a Debian image (stackpin.bootstrap.IMAGE_ENV): the vendor base puts its own
# entries in front of it.
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Debian's lld package links /usr/bin/ld.lld to LLVM's lld; invoked by that name it links
# like GNU ld for ELF, which is what triton's HIP backend runs (TRITON_HIP_LLD_PATH).
DEBIAN_LLD = "/usr/bin/ld.lld"
DEBIAN_LLD_PACKAGE = "lld"


# Every platform whose base image holds a vendor tree (its PlatformSpec says where).
TREES: dict[str, TreeFacts] = {spec.name: spec.vendor_tree for spec in platforms.specs()
                               if spec.vendor_tree is not None}


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One tar member: a folder, a file (text, mode) or a symlink (target)."""

    path: str  # absolute
    kind: str  # "dir", "file" or "link"
    text: str = ""
    mode: int = 0o755
    target: str = ""


def facts(cell: Cell) -> TreeFacts:
    if cell.platform not in TREES:
        msg = f"cell '{cell.id}' is a {cell.platform} cell: only {', '.join(TREES)} have a tree"
        raise ValueError(msg)
    return TREES[cell.platform]


def tree_root(cell: Cell) -> str:
    return facts(cell).root.format(version=cell.platform_version)


def base_path(cell: Cell) -> str:
    """The PATH of the rehearsal base image: the vendor's entries, then Debian's."""
    return ":".join((*facts(cell).path, DEBIAN_PATH))


def _stand_in(what: str, product: str, version: str) -> str:
    return (f"stackpin vendor rehearsal stand-in for {product} {version}'s {what}: not the "
            "vendor's file, it holds no code; the site's vendor base brings the real one")


def _tool(path: str, what: str, product: str, version: str) -> Entry:
    # Exit 69 (EX_UNAVAILABLE): a caller that parses the output finds no card, never a fake.
    line = _stand_in(what, product, version) + "; no device can be read here"
    return Entry(path=path, kind="file",
                 text=f"#!/bin/sh\necho {_sh(line)} >&2\nexit 69\n")


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def env_script(cell: Cell) -> str:
    """The stand-in for the vendor's env.sh: what the cells and L0.dtk_env read (the
    tree's root, its tools and libraries), POSIX sh so dash can source it as well."""
    tree = facts(cell)
    link = tree.link
    return "\n".join((
        f"# {_stand_in('env.sh', tree.product, cell.platform_version)}.",
        f"export ROCM_PATH={link}",
        f"export HIP_PATH={link}",
        f"export PATH={link}/bin:{link}/llvm/bin:$PATH",
        f"export LD_LIBRARY_PATH={link}/lib:{link}/llvm/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}",
        f"export STACKPIN_REHEARSAL_TREE={_sh(tree_root(cell))}",
        "",
    ))


def entries(cell: Cell) -> tuple[Entry, ...]:
    """Every member of the tree layer, parents first."""
    tree, version = facts(cell), cell.platform_version
    root = tree_root(cell)
    files = [
        Entry(path=f"{root}/bin/hipcc", kind="file", text=(
            f"#!/bin/sh\necho {_sh(_stand_in('hipcc', tree.product, version))} >&2\nexit 69\n")),
        Entry(path=f"{root}/lib/{tree.hip_library}", kind="file", mode=0o644,
              text=_stand_in("HIP runtime library", tree.product, version) + "\n"),
        Entry(path=f"{root}/amdgcn/bitcode/ocml.bc", kind="file", mode=0o644,
              text=_stand_in("device bitcode library", tree.product, version) + "\n"),
        Entry(path=f"{root}/llvm/bin/ld.lld", kind="link", target=DEBIAN_LLD),
        Entry(path=tree.link, kind="link", target=root.rsplit("/", 1)[1]),
        *(_tool(_in_tree(path, tree.link, root), what, tree.product, version)
          for path, what in tree.tools),
    ]
    if cell.env_script:
        files.append(Entry(path=_in_tree(cell.env_script, tree.link, root), kind="file",
                           mode=0o644, text=env_script(cell)))
    folders = sorted({parent for item in files for parent in _parents(item.path)})
    return (*(Entry(path=f, kind="dir") for f in folders),
            *sorted(files, key=lambda e: e.path))


def _in_tree(path: str, link: str, root: str) -> str:
    """Where a path the cell names through the link (/opt/dtk/env.sh) is in the tree."""
    return root + path[len(link):] if path.startswith(link + "/") else path


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def tree_tar(cell: Cell, *, mtime: int) -> bytes:
    """The tree as one uncompressed tar layer: same cell, same bytes."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for entry in entries(cell):
            info = tarfile.TarInfo(entry.path.lstrip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
            data = entry.text.encode()
            if entry.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif entry.kind == "link":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.target, 0o777
            else:
                info.mode, info.size = entry.mode, len(data)
            tar.addfile(info, io.BytesIO(data) if entry.kind == "file" else None)
    return out.getvalue()
