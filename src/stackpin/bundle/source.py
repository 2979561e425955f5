"""What a ``--with-wheels`` bundle carries so a site rebuilds the same images offline.

Seed 000's source-build route: the bundle folder is itself a stackpin project, so that at
the site ``cd BUNDLE && stackpin build CELL --offline`` rebuilds from the bundle alone:

    pinning/*.toml, pinning/locks/<cell>.lock   the matrices and each bundled cell's lock
    templates/, verify/                         what render and the build context read
    pinning/tools/installer.toml, wheels/tools/ the pinned installer and its wheel
    wheels/<cell>/                              the locked wheelhouse (export re-hashes it)
    base/<cell>.tar.zst                         the cell's base image, one save stream
    SOURCE_COMMIT                               the commit the images were built from

"The same image identity" is the image ID. The build is normalised (docs/reproducibility.md)
so the ID depends only on the installed files and the image config, and the config holds
the labels: cell, lock digest, stackpin version and the source commit. A folder without
git would label its build "unknown" and get another ID, so the bundle records the commit
of its images (their ``io.stackpin.source-commit`` label) and the build reads it when there
is no git checkout.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import zstandard

from stackpin import tools
from stackpin.bundle.format import BundleImage, Entry, LineSink
from stackpin.bundle.resolved import BuiltImage
from stackpin.engine import Engine
from stackpin.errors import BundleError, HostEnvironmentError
from stackpin.matrix import Cell
from stackpin.primitives import CHUNK
from stackpin.render import base_reference
from stackpin.target import LABEL_SOURCE_COMMIT, Layout
from stackpin.tools import load_installer

SOURCE_COMMIT = "SOURCE_COMMIT"
BASES = "base"
COMMIT_LABEL = LABEL_SOURCE_COMMIT
_COMMIT = re.compile(r"^(?:[0-9a-f]{40}(?:\+dirty)?|unknown)$")
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


def base_archive(root: Path, cell_id: str) -> Path:
    return root / BASES / f"{cell_id}.tar.zst"


def recorded_commit(root: Path) -> str | None:
    """The SOURCE_COMMIT a bundle folder records, or None outside one."""
    path = root / SOURCE_COMMIT
    if not path.is_file():
        return None
    commit = path.read_text(encoding="utf-8").strip()
    if not _COMMIT.match(commit):
        msg = f"{path} holds {commit[:60]!r}, not a commit: get a fresh copy of the bundle"
        raise BundleError(msg)
    return commit


def images_commit(images: Sequence[BundleImage]) -> str:
    """The one source commit every bundled image was built from."""
    commits = sorted({i.labels.get(COMMIT_LABEL, "unknown") for i in images})
    if len(commits) != 1:
        msg = (
            f"the images were built from different commits ({', '.join(commits)}): rebuild "
            "them from one checkout before a --with-wheels export"
        )
        raise BundleError(msg)
    return commits[0]


def rebuild_files(layout: Layout, built: Sequence[BuiltImage]) -> list[Entry]:
    """Everything an offline rebuild reads but the wheels (planned with the locks) and
    the bases (see base_streams): the matrices, the locks the images were built from,
    templates/, verify/ and the images' commit."""
    entries = [Entry(path=m.relative_to(layout.root).as_posix(), source=m)
               for m in layout.matrix_files()]
    locks = {item.selection.cell.id: item.selection.lock for item in built}
    entries += [Entry(path=f"pinning/locks/{cell_id}.lock", data=lock.text().encode())
                for cell_id, lock in locks.items()]
    entries += _tree(layout.templates, "templates") + _tree(layout.root / "verify", "verify")
    # The installer every build runs, pinned apart from the locks (stackpin.tools).
    installer = load_installer(layout.root)
    entries += [Entry(path=tools.PIN.as_posix(), source=layout.root / tools.PIN),
                Entry(path=(tools.TOOLS_DIR / installer.wheel).as_posix(),
                      source=installer.path(layout.root), sha256=installer.sha256)]
    commit = images_commit([item.image for item in built])
    return [*entries, Entry(path=SOURCE_COMMIT, data=f"{commit}\n".encode())]


def base_streams(built: Sequence[BuiltImage]) -> dict[str, str]:
    """base/<cell>.tar.zst to the base that built the cell's images (their build record)."""
    return {f"{BASES}/{item.image.cell}.tar.zst": item.record.base_reference for item in built}


def _tree(folder: Path, prefix: str) -> list[Entry]:
    """Every file under ``folder`` but caches and hidden ones, as entries under ``prefix``."""
    entries = []
    for path in sorted(folder.iterdir()):
        if _SKIP(str(folder), [path.name]):
            continue
        rel = f"{prefix}/{path.name}"
        entries += _tree(path, rel) if path.is_dir() else [Entry(path=rel, source=path)]
    return entries


def load_bundled_base(engine: Engine, cell: Cell, root: Path, *, on_line: LineSink) -> None:
    """``build --offline``: the base must be on the daemon or in the folder's base/."""
    reference = base_reference(cell)
    if engine.image_info(reference) is not None:
        return
    archive = base_archive(root, cell.id)
    if not archive.is_file():
        msg = (
            f"--offline: the base {reference} of {cell.id} is not on this daemon and "
            f"{archive} does not exist: build from a --with-wheels bundle, or load the base"
        )
        raise HostEnvironmentError(msg)
    on_line(f"base: loading {reference} from {archive}")
    with archive.open("rb") as compressed:
        loaded = engine.load(_decompressed(compressed))
    if reference not in loaded.references:
        msg = f"{archive} holds {', '.join(loaded.references) or 'no image'}, not {reference}"
        raise HostEnvironmentError(msg)


def _decompressed(compressed: IO[bytes]) -> Iterator[bytes]:
    # The archive is concatenated frames (bundle.stream): read_to_iter would stop after
    # the first one and hand the engine a cut tar.
    with zstandard.ZstdDecompressor().stream_reader(compressed, read_size=CHUNK,
                                                    read_across_frames=True) as stream:
        while chunk := stream.read(CHUNK):
            yield chunk
