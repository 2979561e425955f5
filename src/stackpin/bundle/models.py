"""The ``models/`` folder: where a site puts model weights, and what a bundle may carry.

The convention: one folder per model under ``models/`` (a Hugging Face folder of
safetensors, or GGUF files), mounted read-only at the service's models path. A bundle
always has ``models/README.md`` stating this, so ``bin/start.sh`` finds the folder; it
carries models only when asked (``bundle export --with-models``), and then only models
that declare their licence in a Hugging Face model card (``README.md`` whose front matter
has ``license:``). Their licence files are copied under ``licenses/models/<name>/`` and
their licences recorded in ``sbom/models.cdx.json``.

User state never travels: a file that is a SQLite database (Studio keeps accounts in
``auth/auth.db`` and chats in ``studio.db``) or Studio's bootstrap password file is
refused wherever it sits in a bundle (``refuse_user_state``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from stackpin.bundle.format import IMAGES, SITE_MODELS
from stackpin.errors import BundleError
from stackpin.primitives import sha256_file

FOLDER = SITE_MODELS.rstrip("/")
WEIGHTS = (".safetensors", ".gguf")
README = """\
# models/

Put each model in its own folder here: a Hugging Face folder (config.json, *.safetensors,
tokenizer files) or GGUF files. `bin/start.sh` mounts this folder read-only where the
service looks for models; the service never downloads one at a site.

This bundle carries no model unless it was exported with `--with-models`; those it carries
declare their licence (the `license:` of their README.md) and are listed in
`sbom/models.cdx.json`, with their licence texts under `licenses/models/`.

Files you add here are yours: `bin/load.sh` and `stackpin bundle verify` check only the
files the manifest lists.
"""
# Hugging Face model-card licence ids that differ from their SPDX id only by case.
_HF_TO_SPDX = {
    "apache-2.0": "Apache-2.0", "mit": "MIT", "bsd-3-clause": "BSD-3-Clause",
    "bsd-2-clause": "BSD-2-Clause", "cc-by-4.0": "CC-BY-4.0", "cc-by-sa-4.0": "CC-BY-SA-4.0",
    "cc-by-nc-4.0": "CC-BY-NC-4.0", "gpl-3.0": "GPL-3.0-only", "agpl-3.0": "AGPL-3.0-only",
    "lgpl-3.0": "LGPL-3.0-only", "cc0-1.0": "CC0-1.0", "openrail": "OpenRAIL",
}
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)", re.S)
_LICENCE_LINE = re.compile(r"^license:\s*['\"]?([^'\"\n#]+?)['\"]?\s*(?:#.*)?$", re.M)
_LICENCE_FILE = re.compile(r"^(?:LICEN[CS]E|COPYING|NOTICE)(?:[._-].*)?$", re.I)
_SQLITE_MAGIC = b"SQLite format 3\x00"
_STATE_NAMES = frozenset({".bootstrap_password"})


@dataclass(frozen=True, kw_only=True)
class ModelFile:
    rel: str  # inside the model's folder
    size: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class ShippedModel:
    """A model folder the bundle carries, with the licence its model card declares."""

    name: str
    licence: str  # SPDX id when the card's id maps to one, else the card's id as written
    files: tuple[ModelFile, ...]
    licence_files: tuple[str, ...]  # rel paths of LICENSE/COPYING/NOTICE files


def card_licence(readme: str) -> str | None:
    """The ``license:`` of a model card's YAML front matter, as an SPDX id when known."""
    front = _FRONT_MATTER.match(readme)
    found = _LICENCE_LINE.search(front.group(1)) if front else None
    if found is None:
        return None
    value = found.group(1).strip()
    return _HF_TO_SPDX.get(value.lower(), value)


def find_models(folder: Path) -> list[ShippedModel]:
    """Every model folder under ``folder`` (the project's models/), each with its licence."""
    if not folder.is_dir():
        msg = f"--with-models: {folder} is missing: put one folder per model there"
        raise BundleError(msg)
    models = []
    for path in sorted(p for p in folder.iterdir() if not p.name.startswith(".")):
        if path.is_file() and path.name == "README.md":
            continue
        models.append(_model(path))
    if not models:
        msg = f"--with-models: {folder} holds no model folder; export without the flag"
        raise BundleError(msg)
    return models


def _model(path: Path) -> ShippedModel:
    where = f"{FOLDER}/{path.name}"
    if path.is_symlink() or not path.is_dir():
        msg = f"{where} is not a folder: put each model in its own folder under {FOLDER}/"
        raise BundleError(msg)
    files = sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink())
    if not any(p.name.endswith(WEIGHTS) for p in files):
        msg = f"{where} holds no {' or '.join(WEIGHTS)} file: it is not a model folder"
        raise BundleError(msg)
    card = path / "README.md"
    licence = card_licence(card.read_text(encoding="utf-8")) if card.is_file() else None
    if not licence:
        msg = (
            f"{where} declares no licence: add a README.md model card whose front matter "
            "has 'license: <id>', or leave the model out of the bundle"
        )
        raise BundleError(msg)
    entries = []
    for file in files:
        rel = file.relative_to(path).as_posix()
        if file.is_symlink():
            msg = f"{where}/{rel} is a link: copy the file itself into the model folder"
            raise BundleError(msg)
        entries.append(ModelFile(rel=rel, size=file.stat().st_size, sha256=sha256_file(file)))
    return ShippedModel(
        name=path.name, licence=licence, files=tuple(entries),
        licence_files=tuple(e.rel for e in entries if _LICENCE_FILE.match(Path(e.rel).name)),
    )


def user_state_problem(path: Path) -> str | None:
    """Why the file at ``path`` is user state (a database, a password file), or None."""
    if path.name in _STATE_NAMES:
        return "Studio's bootstrap password file"
    with path.open("rb") as handle:
        if handle.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC:
            return "a SQLite database (Studio keeps accounts and chats in SQLite)"
    return None


def refuse_user_state(folder: Path, paths: Iterable[str]) -> None:
    """Refuse a bundle in which any file is user state; the images are checked by build."""
    for rel in paths:
        if rel == IMAGES:
            continue
        problem = user_state_problem(folder / rel)
        if problem:
            msg = (
                f"{rel} is {problem}; a bundle never carries user state (accounts, chats): "
                "remove it from its source folder and export again"
            )
            raise BundleError(msg)
