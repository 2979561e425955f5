"""Read what render renders from, write rendered build files to disk and stage a build
context (wheels hard-linked in): the disk side of rendering."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from stackpin import healthcheck
from stackpin.layers import InstallLayer
from stackpin.lock import Lock
from stackpin.render import Rendered, Sources
from stackpin.tools import CONTEXT_DIR
from stackpin.wheelhouse import locate

EXECUTABLE = frozenset({"stackpin/entrypoint.sh"})


def read_sources(templates_dir: Path) -> Sources:
    """Every file of a templates folder by its path there, and the health check module."""
    templates = {path.relative_to(templates_dir).as_posix(): path.read_text(encoding="utf-8")
                 for path in sorted(templates_dir.rglob("*"))
                 if path.is_file() and "__pycache__" not in path.parts}
    return Sources(templates=templates,
                   healthcheck=Path(healthcheck.__file__).read_text(encoding="utf-8"))


def write_rendered(rendered: Rendered, folder: Path) -> None:
    """Write the rendered files; the entrypoint is executable (COPY keeps the mode)."""
    for rel, text in sorted(rendered.files.items()):
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755 if rel in EXECUTABLE else 0o644)


def context_digest(rendered: Rendered, verify_dir: Path, lock_digest: str) -> str:
    """sha256 naming the whole build context: every rendered file, every verify/ file, and
    the lock digest (which pins each wheel's sha256, so wheels are not re-read)."""
    digest = hashlib.sha256(f"lock {lock_digest}\n".encode())
    files = {rel: text.encode() for rel, text in rendered.files.items()}
    for path in sorted(verify_dir.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[f"verify/{path.relative_to(verify_dir).as_posix()}"] = path.read_bytes()
    for rel in sorted(files):
        digest.update(f"{rel} {hashlib.sha256(files[rel]).hexdigest()}\n".encode())
    return digest.hexdigest()


def stage_context(
    rendered: Rendered, lock: Lock, *, root: Path, folder: Path,
    layers: tuple[InstallLayer, ...],
    tools: tuple[Path, ...] = (),
) -> Path:
    """A complete build context: rendered files, verify/, each layer's locked wheels (in
    wheels/LAYER/: stackpin.layers.install_layers of the lock) and
    the build tools' files (``tools``: the pinned installer's wheel, checked already) in tools/.

    Wheels are hard-linked when the filesystem allows (no copy of gigabytes), else copied.
    The folder is rebuilt from scratch so no stale wheel can slip into a layer.
    """
    if folder.exists():
        shutil.rmtree(folder)
    write_rendered(rendered, folder)
    shutil.copytree(
        root / "verify", folder / "verify", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    for layer in layers:
        for wheel in layer.wheels:
            target = folder / "wheels" / layer.name / wheel.filename
            _link_or_copy(locate(root, lock.cell, wheel.filename), target)
    for tool in tools:
        _link_or_copy(tool, folder / CONTEXT_DIR / tool.name)
    return folder


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
