"""Cell locks: every wheel an image installs (name, version, filename, sha256, layer group).

A lock is a pure function of the cell and the wheelhouse listing (filename -> sha256). It is
written as canonical JSON, so its sha256 (the *lock digest*) names exactly what a build
installs; that digest goes into the image tag and label. The lock also records a digest of
the cell itself, so editing a pin makes the lock stale and the build refuses it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from stackpin.abi import NAME_MAX
from stackpin.boundary import vendor_pins
from stackpin.errors import ConfigurationError, ValidationError
from stackpin.matrix import Cell, cell_json, pinned_wheels
from stackpin.matrix_safety import CELL_ID, CELL_ID_MAX
from stackpin.primitives import pretty_json
from stackpin.resolve import Pip, Resolution, ResolutionFailed, attention_only, resolve_cell
from stackpin.untrusted import parse_json, read_bounded, shown

LOCK_VERSION = 2
MAX_LOCK_BYTES = 16 << 20  # a lock of 1000 wheels is about 1 MiB
# 'base' = provided by the base image: recorded, checked in the image, never installed.
Group = Literal["vendor", "stack", "attention", "base"]
# Install order = layer order: the big ABI-bound wheels first (they change least), the
# attention wheel last so the stable and enhanced images share every earlier layer.
GROUPS: tuple[Group, ...] = ("vendor", "stack", "attention")
Source = Literal["index", "vendor", "base"]


@dataclass(frozen=True, kw_only=True)
class LockedWheel:
    name: str
    version: str
    filename: str
    sha256: str
    group: Group
    source: Source
    # Provenance: the index URL, "vendor file wheels/vendor/<file>" or "base image <ref>".
    origin: str = ""


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
    resolution_key: str = ""
    excluded: Mapping[str, str] = field(default_factory=dict)
    dropped: tuple[tuple[str, str, str], ...] = ()

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
            "resolution": {"resolver": "pip", "key": self.resolution_key},
            "excluded": dict(self.excluded),
            "dropped": [{"of": o, "requirement": r, "reason": why} for o, r, why in self.dropped],
            "wheels": [
                {
                    "name": w.name,
                    "version": w.version,
                    "filename": w.filename,
                    "sha256": w.sha256,
                    "group": w.group,
                    "source": w.source,
                    "origin": w.origin,
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

    def installed(self) -> tuple[LockedWheel, ...]:
        """What the build installs: everything but what the base image provides."""
        return tuple(w for w in self.wheels if w.group != "base")

    def vendor_files(self) -> tuple[LockedWheel, ...]:
        """The files a release engineer drops into wheels/vendor/ by hand."""
        return tuple(w for w in self.wheels if w.source == "vendor")


def cell_digest(cell: Cell) -> str:
    return hashlib.sha256(cell_json(cell).encode()).hexdigest()


def wheel_name_version(filename: str) -> tuple[str, str]:
    """Canonical distribution name and full version (local label kept) of a wheel file."""
    try:
        if len(filename) > NAME_MAX:
            msg = f"{len(filename)} characters, more than a file name holds"
            raise InvalidWheelFilename(msg)
        name, version, _build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        msg = f"{filename}: not a wheel filename ({exc}); remove it from the wheelhouse"
        raise ValidationError(msg) from None
    return str(name), str(version)


def lock_from_resolution(
    cell: Cell, resolution: Resolution, *, base_reference: str, base_digest: str = ""
) -> Lock:
    """Lock a cell from its resolved closure: every distribution, where it comes from, hash.

    Index files carry pip's reported sha256; vendor files carry the matrix's pinned sha256
    (empty until the release engineer pins it: the lock is then incomplete and the build
    refuses it); base-image distributions are recorded, never installed.
    """
    if not resolution.ok:
        msg = f"{cell.id}: cannot lock: {resolution.conflicts[0].message}"
        raise ValidationError(msg, details=[str(c) for c in resolution.conflicts])
    groups = _groups(cell)
    enhanced_only = attention_only(cell, resolution.closure)
    vendor = vendor_pins(cell)
    problems: list[str] = []
    wheels = []
    for entry in resolution.closure:
        group = "attention" if entry.name in enhanced_only else groups.get(entry.name, "stack")
        if entry.origin == "vendor-wheel":
            pin = vendor[entry.name]
            wheels.append(LockedWheel(
                name=entry.name, version=entry.version, filename=pin.filename,
                sha256=pin.sha256, group=group, source="vendor",
                origin=f"vendor file wheels/vendor/{pin.filename}"))
        elif entry.origin == "base-image":
            wheels.append(LockedWheel(
                name=entry.name, version=entry.version, filename="", sha256="",
                group="base", source="base", origin=f"base image {base_reference}"))
        else:
            problems += _pinned_index_mismatch(cell, entry.filename, entry.sha256)
            wheels.append(LockedWheel(
                name=entry.name, version=entry.version, filename=entry.filename,
                sha256=entry.sha256, group=group, source="index", origin=entry.url))
    if problems:
        msg_0 = f"{cell.id}: {problems[0]}"
        raise ValidationError(msg_0, details=problems)
    order = {g: i for i, g in enumerate((*GROUPS, "base"))}
    wheels.sort(key=lambda w: (order[w.group], w.name, w.filename))
    return Lock(
        cell=cell.id, cell_digest=cell_digest(cell), python=cell.python,
        source_date_epoch=cell.source_date_epoch, base_reference=base_reference,
        base_digest=base_digest, wheels=tuple(wheels),
        missing=tuple(sorted(w.filename for w in wheels if w.source == "vendor" and not w.sha256)),
        resolution_key=resolution.key,
        excluded=dict(sorted(cell.excluded.items())),
        dropped=tuple((d.of, d.requirement, d.reason) for d in cell.dropped),
    )


def _groups(cell: Cell) -> dict[str, Group]:
    """Layer group of the pinned ABI-bound wheels; everything else is 'stack'."""
    groups: dict[str, Group] = {
        str(canonicalize_name(w.filename.split("-")[0])): "vendor"
        for w in (cell.torch, *cell.vendor_wheels)
    }
    if cell.attention is not None:  # installed by the enhanced variant only
        groups[str(canonicalize_name(cell.attention.filename.split("-")[0]))] = "attention"
    return groups


def _pinned_index_mismatch(cell: Cell, filename: str, sha256: str) -> list[str]:
    for _path, pin in pinned_wheels(cell):
        if pin.source == "index" and pin.filename == filename and pin.sha256 not in ("", sha256):
            return [f"{filename}: the index serves sha256 {sha256}, the cell pins {pin.sha256}; "
                    "the file is not the one the cell pins: check the index or the pin"]
    return []


def parse_lock(text: str | bytes, *, source: str) -> Lock:
    """Read a lock file's text; a malformed lock is a configuration error.

    A lock is input like a matrix (it may come from a pull request or a bundle): parsed
    under the strict JSON rules, and every value a later step hands on (file names joined
    to wheels/, versions and hashes written into requirement lines) checked for its shape.
    """
    data = text.encode("utf-8") if isinstance(text, str) else text
    document = parse_json(data, what=source, error=ConfigurationError)
    try:
        lock = _lock_of(document, source)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        msg = (f"{shown(source)}: not a stackpin lock ({shown(repr(exc), limit=120)}); "
               "re-create it with 'stackpin lock'")
        raise ConfigurationError(msg) from None
    if problem := lock_problem(lock):
        msg = f"{shown(source)}: {problem}; re-create it with 'stackpin lock'"
        raise ConfigurationError(msg)
    return lock


def _lock_of(data: Any, source: str) -> Lock:
    if data["lock_version"] != LOCK_VERSION:
        msg = f"{shown(source)}: lock_version {data['lock_version']} is not {LOCK_VERSION}"
        raise ConfigurationError(msg + "; re-create it with 'stackpin lock'")
    wheels = tuple(
        LockedWheel(name=_text(w["name"]), version=_text(w["version"]),
                    filename=_text(w["filename"]), sha256=_text(w["sha256"]),
                    group=w["group"], source=w["source"], origin=_text(w["origin"]))
        for w in data["wheels"]
    )
    return Lock(
        cell=_text(data["cell"]), cell_digest=_text(data["cell_digest"]),
        python=_text(data["python"]), source_date_epoch=_number(data["source_date_epoch"]),
        base_reference=_text(data["base"]["reference"]),
        base_digest=_text(data["base"]["digest"]), wheels=wheels,
        missing=tuple(_text(m) for m in data["missing"]),
        resolution_key=_text(data["resolution"]["key"]),
        excluded={_text(k): _text(v) for k, v in data["excluded"].items()},
        dropped=tuple((_text(d["of"]), _text(d["requirement"]), _text(d["reason"]))
                      for d in data["dropped"]),
    )


def _text(value: Any) -> str:
    if not isinstance(value, str):
        msg = f"expected a string, found {type(value).__name__}"
        raise TypeError(msg)
    return value


def _number(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"expected an integer, found {type(value).__name__}"
        raise TypeError(msg)
    return value


_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,98}[a-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9.+!_-]{1,128}")
_WHEEL = re.compile(r"[A-Za-z0-9_.+!-]{1,251}\.whl")


def _wheel_problem(wheel: LockedWheel) -> str | None:
    if wheel.group not in (*GROUPS, "base") or wheel.source not in ("index", "vendor", "base"):
        return f"group {shown(wheel.group)!r} or source {shown(wheel.source)!r} is unknown"
    if not (_NAME.fullmatch(wheel.name) and _VERSION.fullmatch(wheel.version)):
        return (f"{shown(wheel.name, limit=60)!r} {shown(wheel.version, limit=60)!r} is not a "
                "distribution name and an exact version")
    if wheel.sha256 and not _SHA256.fullmatch(wheel.sha256):
        return "sha256 is not 64 hex digits"
    if wheel.source != "base" and not _bare_wheel(wheel.filename):
        return f"filename {shown(wheel.filename, limit=60)!r} is not a bare wheel file name"
    return None


def _bare_wheel(name: str) -> bool:
    return bool(_WHEEL.fullmatch(name)) and not name.startswith(".")


def lock_problem(lock: Lock) -> str | None:
    """The first value of a lock that could not have come from 'stackpin lock', or None."""
    # The digests are only compared with what this stackpin computes: any string will do.
    # The cell id names the wheelhouse folder (wheels/<cell>/): the matrix's id rule.
    if len(lock.cell) > CELL_ID_MAX or not CELL_ID.fullmatch(lock.cell):
        return f"cell {shown(lock.cell, limit=60)!r} is not a cell id"
    for index, wheel in enumerate(lock.wheels):
        if problem := _wheel_problem(wheel):
            return f"wheels[{index}]: {problem}"
    for name in lock.missing:
        if not _bare_wheel(name):
            return f"missing: {shown(name, limit=60)!r} is not a bare wheel file name"
    return None


def lock_path(root: Path, cell_id: str) -> Path:
    return root / "pinning" / "locks" / f"{cell_id}.lock"


def read_lock(root: Path, cell_id: str) -> Lock | None:
    path = lock_path(root, cell_id)
    if not path.exists():
        return None
    data = read_bounded(path, limit=MAX_LOCK_BYTES, what="lock", error=ConfigurationError)
    return parse_lock(data, source=str(path))


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


def resolve_keeping(cell: Cell, pip: Pip, previous: Lock | None, *, use_cache: bool = True
                    ) -> tuple[Resolution, bool]:
    """Resolve the cell holding the previous lock's version of every index distribution the
    cell does not pin (uv's and poetry's rule for a lock: change what you changed), and
    True when held; where the new pins need other versions, a fresh resolution, and False.

    So one pin changed moves that pin and what it needs, not every transitive wheel the
    index has released since: the image's lower layers and a site's delta stay small.
    """
    keep = {w.name: w.version for w in previous.wheels if w.source == "index"} if previous else {}
    if keep:
        try:
            held = resolve_cell(cell, pip, use_cache=use_cache, keep=keep)
        except ResolutionFailed:
            held = None
        if held is not None and held.ok:
            return held, True
    return resolve_cell(cell, pip, use_cache=use_cache), False


def changed_pins(old: Lock | None, new: Lock) -> list[str]:
    """One line per distribution the new lock adds, removes or moves, by name."""
    before, after = (old.pins() if old else {}), new.pins()
    lines = [f"{n} {before[n]} -> {after[n]}" for n in sorted(before.keys() & after.keys())
             if before[n] != after[n]]
    lines += [f"{n} {after[n]} (new)" for n in sorted(after.keys() - before.keys())]
    lines += [f"{n} {before[n]} (gone)" for n in sorted(before.keys() - after.keys())]
    return lines


def relock(cell: Cell, root: Path, pip: Pip, *, base_reference: str) -> tuple[Lock, bool]:
    """The cell's current lock, or a new one from a resolution (written); True when new."""
    lock = read_lock(root, cell.id)
    if lock is not None and stale_reason(lock, cell) is None:
        return lock, False
    resolution, _held = resolve_keeping(cell, pip, lock)
    lock = lock_from_resolution(cell, resolution, base_reference=base_reference,
                                base_digest=cell.base.digest)
    write_text_atomic(lock_path(root, cell.id), lock.text())
    return lock, True
