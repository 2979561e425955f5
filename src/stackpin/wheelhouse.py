"""The offline wheelhouse: fetch binary wheels for a cell's target, hash them, verify them.

Layout: ``wheels/<cell>/`` holds what ``pip download`` fetched for the cell's CPython, ABI
and platform (never the host's); ``wheels/vendor/`` holds the vendor wheels a user drops in
by hand (DTK torch, DTK FlashAttention), shared by every cell. The lock names the file each
build installs, so a wheel present but unlocked is never installed.

Commands run through a ``Runner`` (argv, line callback) -> exit code: the one seam tests
replace, as tox does with its executor.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stackpin.errors import HostEnvironmentError, ValidationError
from stackpin.lock import Lock, stale_reason
from stackpin.matrix import Cell
from stackpin.piptarget import (
    LineSink,
    Runner,
    python_version,
    subprocess_runner,
    target_platforms,
)
from stackpin.primitives import sha256_file, staged_folder
from stackpin.wheelcache import keep, take


def cell_dir(root: Path, cell_id: str) -> Path:
    return root / "wheels" / cell_id


def vendor_dir(root: Path) -> Path:
    return root / "wheels" / "vendor"


def pip_download_argv(
    cell: Cell, *, dest: Path, requirements: Path, python: str = sys.executable
) -> list[str]:
    """pip download of exactly the locked files for the cell's target (no resolution)."""
    argv = [
        python, "-m", "pip", "download", "--disable-pip-version-check",
        "--only-binary=:all:", "--implementation", "cp",
        "--python-version", python_version(cell), "--abi", cell.python, "--abi", "abi3",
        "--abi", "none",
    ]
    for tag in target_platforms(cell):
        argv += ["--platform", tag]
    # The lock already names every wheel and its hash: pip must not resolve anything.
    return [*argv, "--dest", str(dest), "-r", str(requirements), "--no-deps", "--require-hashes"]


def locked_requirements(lock: Lock, *, skip: frozenset[str] = frozenset()) -> str:
    """Requirements that download exactly the lock's index wheels, hash-checked (those
    named in ``skip`` are left out: the cache gave them)."""
    lines = [
        f"{w.name}=={w.version} --hash=sha256:{w.sha256}"
        for w in lock.wheels
        if w.source == "index" and w.filename not in skip
    ]
    return "\n".join(lines) + "\n" if lines else ""


@dataclass(frozen=True, kw_only=True)
class VendorFile:
    """A file the release engineer drops into wheels/vendor/: what the lock expects of it."""

    filename: str
    name: str
    version: str
    sha256: str  # pinned in the matrix; "" = not pinned yet
    present: bool

    def line(self) -> str:
        state = "present" if self.present else "missing"
        pin = f"sha256 {self.sha256[:12]}" if self.sha256 else "sha256 not pinned"
        return f"{self.filename} ({self.name} {self.version}; {pin}; {state})"


def vendor_files_needed(lock: Lock, root: Path) -> list[VendorFile]:
    """Every vendor file the lock installs, whether it is already in wheels/vendor/."""
    return [
        VendorFile(filename=w.filename, name=w.name, version=w.version, sha256=w.sha256,
                   present=(vendor_dir(root) / w.filename).is_file())
        for w in lock.vendor_files()
    ]


def pin_command(filename: str) -> str:
    """The command whose output is the sha256 to set in the matrix for a vendor file."""
    return f"sha256sum wheels/vendor/{filename}"


def locate(root: Path, cell_id: str, filename: str) -> Path:
    """Where a locked wheel lives: the cell's folder, else wheels/vendor/."""
    for folder in (cell_dir(root, cell_id), vendor_dir(root)):
        if (folder / filename).is_file():
            return folder / filename
    msg = (
        f"{filename} (locked for {cell_id}) is not in the wheelhouse: "
        f"run 'stackpin wheels fetch {cell_id}'"
    )
    raise HostEnvironmentError(msg)


@dataclass(frozen=True, kw_only=True)
class Mismatch:
    filename: str
    expected: str
    actual: str  # "" when the file is missing

    def __str__(self) -> str:
        if not self.actual:
            return f"{self.filename}: missing (expected sha256 {self.expected})"
        return f"{self.filename}: sha256 {self.actual}, the lock expects {self.expected}"


def verify_wheelhouse(lock: Lock, root: Path) -> list[Mismatch]:
    """Re-hash every locked wheel; an empty list means the wheelhouse is exactly the lock."""
    problems = []
    for wheel in lock.installed():
        try:
            actual = sha256_file(locate(root, lock.cell, wheel.filename))
        except HostEnvironmentError:
            actual = ""
        if actual != wheel.sha256:
            problems.append(Mismatch(filename=wheel.filename, expected=wheel.sha256, actual=actual))
    return problems


@dataclass(frozen=True, kw_only=True)
class FetchResult:
    wheel_count: int
    bytes: int
    vendor: tuple[VendorFile, ...]
    cached: int = 0  # of wheel_count, taken from the machine-wide cache (re-hashed)


def fetch(
    cell: Cell,
    root: Path,
    lock: Lock,
    *,
    runner: Runner = subprocess_runner,
    on_line: LineSink = lambda _line: None,
    cache: Path | None = None,
) -> FetchResult:
    """Fill wheels/<cell>/ with exactly the lock's index wheels (hash-checked, no resolution).

    With ``cache`` (the machine-wide wheel cache, ``stackpin.wheelcache``) each wheel found
    there under its locked sha256, re-hashed, is linked in, and pip downloads the rest,
    which are then kept there. Vendor files are never downloaded: the result lists which
    ones wheels/vendor/ must hold. The folder is swapped in whole only after pip
    succeeded, so a failed fetch leaves the old wheelhouse intact.
    """
    if reason := stale_reason(lock, cell):
        msg = f"{cell.id}: {reason}; run 'stackpin lock {cell.id}' first"
        raise ValidationError(msg)
    target = cell_dir(root, cell.id)
    target.parent.mkdir(parents=True, exist_ok=True)
    with staged_folder(target) as staging, tempfile.TemporaryDirectory() as tmp:
        cached = _from_cache(lock, cache, staging)
        if cached:
            on_line(f"wheel cache: {len(cached)} wheel(s) re-hashed and linked from {cache}")
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(locked_requirements(lock, skip=cached), encoding="utf-8")
        if requirements.stat().st_size:
            _download(cell, staging, requirements, runner=runner, on_line=on_line)
        if cache is not None:
            _keep_downloaded(lock, cache, staging, cached)
    files = list(target.glob("*.whl"))
    return FetchResult(wheel_count=len(files), bytes=sum(p.stat().st_size for p in files),
                       vendor=tuple(vendor_files_needed(lock, root)), cached=len(cached))


def _from_cache(lock: Lock, cache: Path | None, staging: Path) -> frozenset[str]:
    if cache is None:
        return frozenset()
    return frozenset(
        w.filename for w in lock.wheels
        if w.source == "index" and w.sha256
        and take(cache, sha256=w.sha256, filename=w.filename, dest=staging / w.filename)
    )


def _download(cell: Cell, staging: Path, requirements: Path, *, runner: Runner,
              on_line: LineSink) -> None:
    argv = pip_download_argv(cell, dest=staging, requirements=requirements)
    on_line(f"pip download for {cell.python} / {cell.cpu_arch} / glibc {cell.glibc}")
    if runner(argv, on_line) != 0:
        msg = (
            f"pip download failed for cell {cell.id}; the output above names the wheel "
            "pip could not find for this target (check the lock and the index)"
        )
        raise HostEnvironmentError(msg)


def _keep_downloaded(lock: Lock, cache: Path, staging: Path, cached: frozenset[str]) -> None:
    """pip checked each download against the lock's hash (--require-hashes): keep them."""
    for wheel in lock.wheels:
        path = staging / wheel.filename
        if wheel.source == "index" and wheel.filename not in cached and path.is_file():
            keep(cache, sha256=wheel.sha256, path=path)


def require_complete(lock: Lock, cell: Cell, root: Path) -> None:
    """Refuse a build whose lock is incomplete or not what the wheelhouse holds.

    The lock is current already: stackpin.target checked that once for the verb.
    """
    if lock.missing:
        msg = (f"{cell.id}: vendor file {lock.missing[0]} has no sha256: drop it into "
               f"wheels/vendor/, set its sha256 in the matrix ({pin_command(lock.missing[0])}), "
               f"then 'stackpin lock {cell.id}'")
        raise ValidationError(msg)
    unpinned = [w.filename for w in lock.wheels if not w.sha256]
    if unpinned:
        msg = f"{cell.id}: {unpinned[0]} has no sha256 in the lock; run 'stackpin wheels fetch'"
        raise ValidationError(msg)
    if mismatches := verify_wheelhouse(lock, root):
        msg_0 = (
            f"{cell.id}: wheelhouse does not match the lock: {mismatches[0]}; "
            f"re-fetch with 'stackpin wheels fetch {cell.id}'"
        )
        raise ValidationError(
            msg_0,
            details=[str(m) for m in mismatches],
        )
