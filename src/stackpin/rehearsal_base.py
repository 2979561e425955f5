"""The base image of a vendor rehearsal cell: Debian from packages plus a stand-in vendor tree.

Two layers: the cell's bootstrapped Debian rootfs (``stackpin.bootstrap``: mmdebstrap, the
same recipe and cache as the CPU cell's base, with Debian's lld added for a real ld.lld),
then the platform's stand-in tree (``stackpin.vendortree``). The image config puts the
vendor's tools on PATH, as a vendor base image does, and carries the rehearsal label, so
the base says what it is before any stackpin layer goes on it. K100 and BW rehearse the
same DTK release, so they share this image; every rehearsal cell shares its rootfs (made at the
host cell's epoch, whatever the cell's own).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path

from stackpin import bootstrap, vendortree
from stackpin.engine import Engine
from stackpin.engine.save_format import image_layout
from stackpin.errors import HostEnvironmentError
from stackpin.lock import atomic_write
from stackpin.matrix import Cell
from stackpin.primitives import canonical_bytes, rfc3339, sha256_file
from stackpin.target import LABEL_BOOTSTRAP_DIGEST, LABEL_REHEARSAL


def _ignore(_line: str) -> None:
    """Default progress sink."""


def rootfs_request(cell: Cell) -> bootstrap.BootstrapRequest:
    """The cell's Debian bootstrap at the base's epoch (the host cell's), not the cell's:
    every rehearsal cell, whatever its SOURCE_DATE_EPOCH, starts from one rootfs."""
    return dataclasses.replace(bootstrap.bootstrap_request(cell), source_date_epoch=_epoch(cell))


def _epoch(cell: Cell) -> int:
    marked = cell.rehearsal
    return marked.base_epoch if marked is not None and marked.base_epoch else cell.source_date_epoch


def description(cell: Cell) -> str:
    tree = vendortree.facts(cell)
    return (f"vendor rehearsal base: Debian {rootfs_request(cell).suite} with a "
            f"stand-in {tree.product} {cell.platform_version} tree at "
            f"{vendortree.tree_root(cell)}; not the vendor's base image")


def _recipe(cell: Cell) -> dict[str, object]:
    """Everything that decides the base's bytes (the digest below is its name)."""
    tree = vendortree.tree_tar(cell, mtime=_epoch(cell))
    return {
        "rootfs": bootstrap.request_digest(rootfs_request(cell)),
        "tree": hashlib.sha256(tree).hexdigest(),
        "env": list(_env(cell)),
        "label": description(cell),
    }


def base_digest(cell: Cell) -> str:
    return hashlib.sha256(canonical_bytes(_recipe(cell), ascii_only=True)).hexdigest()


def reference(cell: Cell) -> str:
    """What FROM names for a rehearsal cell: its platform and the recipe's digest."""
    return f"stackpin/rehearsal-base-{cell.platform}:{base_digest(cell)[:12]}"


def _env(cell: Cell) -> tuple[str, ...]:
    return (f"PATH={vendortree.base_path(cell)}", "LANG=C.UTF-8")


def image_config(cell: Cell, *, diff_ids: tuple[str, str]) -> bytes:
    """The base's config: canonical bytes, so its image ID is the same on every host."""
    req = rootfs_request(cell)
    created = rfc3339(_epoch(cell))
    config = {
        "architecture": req.architecture,
        "os": "linux",
        "created": created,
        "config": {
            "Env": list(_env(cell)),
            "Cmd": list(bootstrap.IMAGE_CMD),
            "Labels": {LABEL_BOOTSTRAP_DIGEST: base_digest(cell),
                       LABEL_REHEARSAL: description(cell)},
        },
        "history": [{"created": created, "created_by": f"stackpin bootstrap: {req.suite}"},
                    {"created": created, "created_by": description(cell)}],
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
    }
    return canonical_bytes(config, ascii_only=True)


def ensure(engine: Engine, cell: Cell, *, cache_dir: Path,
           on_line: Callable[[str], None] = _ignore) -> str:
    """The rehearsal base's reference, built and loaded only when missing."""
    ref = reference(cell)
    present = engine.image_info(ref)
    if present is not None and present.labels.get(LABEL_BOOTSTRAP_DIGEST) == base_digest(cell):
        on_line(f"base: {ref} is already loaded; reusing it")
        return ref
    req = rootfs_request(cell)
    rootfs = bootstrap.rootfs_path(req, cache_dir)
    if rootfs.exists():
        on_line(f"base: reusing the cached rootfs {rootfs}")
    else:
        bootstrap.run_mmdebstrap(req, rootfs, on_line=on_line)
    tree = cache_dir / f"rehearsal-tree-{cell.platform}-{base_digest(cell)[:12]}.tar"
    with atomic_write(tree) as tmp:
        tmp.write_bytes(vendortree.tree_tar(cell, mtime=_epoch(cell)))
    diff_ids = (f"sha256:{sha256_file(rootfs)}", f"sha256:{sha256_file(tree)}")
    layout = image_layout(image_config(cell, diff_ids=diff_ids),
                          [(diff_ids[0], rootfs), (diff_ids[1], tree)], tags=(ref,),
                          mtime=_epoch(cell))
    engine.load(layout.chunks)
    info = engine.image_info(ref)
    if info is None:
        msg = f"the Docker daemon loaded the rehearsal base but has no {ref}; see `docker images`"
        raise HostEnvironmentError(msg)
    on_line(f"base: loaded {ref} (image {info.id}): {description(cell)}")
    return ref
