"""Cell locks: every wheel an image installs (name, version, filename, sha256, layer group).

A lock is a pure function of the cell and the wheelhouse listing (filename -> sha256). It is
written as canonical JSON, so its sha256 (the *lock digest*) names exactly what a build
installs; that digest goes into the image tag and label. The lock also records a digest of
the cell itself, so editing a pin makes the lock stale and the build refuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)

from stackpin.errors import ConfigurationError, ValidationError
from stackpin.matrix import Cell, PinnedWheel, cell_json
from stackpin.primitives import pretty_json

LOCK_VERSION = 1
Group = Literal["vendor", "stack", "attention"]
# Install order = layer order: the big ABI-bound wheels first (they change least), the
# attention wheel last so the stable and enhanced images share every earlier layer.
GROUPS: tuple[Group, ...] = ("vendor", "stack", "attention")


@dataclass(frozen=True, kw_only=True)
class LockedWheel:
    name: str
    version: str
    filename: str
    sha256: str
    group: Group
    source: Literal["index", "vendor"]


@dataclass(frozen=True, kw_only=True)
class Lock:
    cell: str
    cell_digest: str
    python: str
    source_date_epoch: int
    base_reference: str
    base_digest: str
    wheels: tuple[LockedWheel, ...]
    missing: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.missing and all(w.sha256 for w in self.wheels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lock_version": LOCK_VERSION,
            "cell": self.cell,
            "cell_digest": self.cell_digest,
            "python": self.python,
            "source_date_epoch": self.source_date_epoch,
            "base": {"reference": self.base_reference, "digest": self.base_digest},
            "missing": list(self.missing),
            "wheels": [
                {
                    "name": w.name,
                    "version": w.version,
                    "filename": w.filename,
                    "sha256": w.sha256,
                    "group": w.group,
                    "source": w.source,
                }
                for w in self.wheels
            ],
        }

    def text(self) -> str:
        return pretty_json(self.to_dict())

    @cached_property
    def digest(self) -> str:
        """sha256 of the canonical text; computed once (the lock is frozen)."""
        return hashlib.sha256(self.text().encode()).hexdigest()

    def group(self, group: Group) -> tuple[LockedWheel, ...]:
        return tuple(w for w in self.wheels if w.group == group)

    def pins(self) -> dict[str, str]:
        """Distribution name -> exact version of everything the lock installs."""
        return {w.name: w.version for w in self.wheels}


def cell_digest(cell: Cell) -> str:
    return hashlib.sha256(cell_json(cell).encode()).hexdigest()


def wheel_name_version(filename: str) -> tuple[str, str]:
    """Canonical distribution name and full version (local label kept) of a wheel file."""
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        msg = f"{filename}: not a wheel filename ({exc}); remove it from the wheelhouse"
        raise ValidationError(msg) from None
    return str(name), str(version)


def _pinned_groups(cell: Cell) -> dict[str, tuple[Group, PinnedWheel]]:
    pinned: dict[str, tuple[Group, PinnedWheel]] = {
        w.filename: ("vendor", w) for w in (cell.torch, *cell.vendor_wheels)
    }
    if cell.attention is not None and cell.locks_attention:
        pinned[cell.attention.filename] = ("attention", cell.attention)
    return pinned


def build_lock(
    cell: Cell,
    wheelhouse: Mapping[str, str],
    *,
    base_reference: str,
    base_digest: str = "",
) -> Lock:
    """Lock a cell against a wheelhouse listing {filename: sha256}.

    Pinned wheels must be present with their pinned sha256; a pinned wheel that is absent
    is recorded as missing (an incomplete lock, which the build refuses). Every other file
    is a stack wheel; one version per distribution, and the stack table's versions must be
    the ones found.
    """
    pinned = _pinned_groups(cell)
    problems: list[str] = []
    wheels: list[LockedWheel] = []
    missing: list[str] = []
    for filename, (group, pin) in sorted(pinned.items()):
        found = wheelhouse.get(filename)
        if found is None:
            missing.append(filename)
            continue
        if pin.sha256 and pin.sha256 != found:
            problems.append(
                f"{filename}: sha256 {found} does not match the pinned {pin.sha256}; "
                "the file is not the one the cell pins: fetch the right file"
            )
        name, version = wheel_name_version(filename)
        wheels.append(
            LockedWheel(
                name=name, version=version, filename=filename, sha256=found,
                group=group, source=pin.source,
            )
        )
    for filename, sha in sorted(wheelhouse.items()):
        if filename in pinned or _belongs_to_other_variant(cell, filename):
            continue
        name, version = wheel_name_version(filename)
        wheels.append(
            LockedWheel(
                name=name, version=version, filename=filename, sha256=sha,
                group="stack", source="index",
            )
        )
    problems += _duplicate_dists(wheels) + _stack_mismatches(cell, wheels)
    if problems:
        msg = f"{cell.id}: the wheelhouse does not fit the cell: {problems[0]}"
        raise ValidationError(
            msg, details=problems
        )
    order = {g: i for i, g in enumerate(GROUPS)}
    wheels.sort(key=lambda w: (order[w.group], w.name, w.filename))
    return Lock(
        cell=cell.id,
        cell_digest=cell_digest(cell),
        python=cell.python,
        source_date_epoch=cell.source_date_epoch,
        base_reference=base_reference,
        base_digest=base_digest,
        wheels=tuple(wheels),
        missing=tuple(missing),
    )


def _belongs_to_other_variant(cell: Cell, filename: str) -> bool:
    # An attention wheel of a cell that builds no enhanced variant is ignored, not locked.
    return cell.attention is not None and filename == cell.attention.filename


def _duplicate_dists(wheels: list[LockedWheel]) -> list[str]:
    seen: dict[str, str] = {}
    problems = []
    for wheel in wheels:
        if wheel.name in seen and seen[wheel.name] != wheel.filename:
            problems.append(
                f"{wheel.name}: two files ({seen[wheel.name]}, {wheel.filename}); "
                "keep one version per distribution in the wheelhouse"
            )
        seen[wheel.name] = wheel.filename
    return problems


def _stack_mismatches(cell: Cell, wheels: list[LockedWheel]) -> list[str]:
    found = {w.name: w.version for w in wheels}
    problems = []
    for dist, version in sorted(cell.stack.items()):
        have = found.get(str(canonicalize_name(dist)))
        if have is None:
            problems.append(
                f"{dist}=={version} is pinned in the stack but not in the wheelhouse; "
                f"run 'stackpin wheels fetch {cell.id}'"
            )
        elif have != version:
            problems.append(
                f"{dist}: the stack pins {version} but the wheelhouse has {have}; "
                f"run 'stackpin wheels fetch {cell.id}'"
            )
    return problems


def parse_lock(text: str, *, source: str) -> Lock:
    """Read a lock file's text; a malformed lock is a configuration error."""
    try:
        data = json.loads(text)
        if data["lock_version"] != LOCK_VERSION:
            msg = f"{source}: lock_version {data['lock_version']} is not {LOCK_VERSION}"
            raise ConfigurationError(msg + "; re-create it with 'stackpin lock'")
        wheels = tuple(
            LockedWheel(
                name=w["name"], version=w["version"], filename=w["filename"],
                sha256=w["sha256"], group=w["group"], source=w["source"],
            )
            for w in data["wheels"]
        )
        return Lock(
            cell=data["cell"],
            cell_digest=data["cell_digest"],
            python=data["python"],
            source_date_epoch=data["source_date_epoch"],
            base_reference=data["base"]["reference"],
            base_digest=data["base"]["digest"],
            wheels=wheels,
            missing=tuple(data.get("missing", ())),
        )
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        msg = f"{source}: not a stackpin lock ({exc!r}); re-create it with 'stackpin lock'"
        raise ConfigurationError(msg) from None


def lock_path(root: Path, cell_id: str) -> Path:
    return root / "pinning" / "locks" / f"{cell_id}.lock"


def read_lock(root: Path, cell_id: str) -> Lock | None:
    path = lock_path(root, cell_id)
    if not path.exists():
        return None
    return parse_lock(path.read_text(encoding="utf-8"), source=str(path))


def stale_reason(lock: Lock, cell: Cell) -> str | None:
    """Why a lock no longer describes its cell, or None when it does."""
    if lock.cell != cell.id:
        return f"the lock is for cell '{lock.cell}', not '{cell.id}'"
    if lock.cell_digest != cell_digest(cell):
        return "the cell changed since the lock was written"
    return None


@contextmanager
def atomic_write(path: Path, *, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        tmp_path.chmod(mode)
        tmp_path.replace(path)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
