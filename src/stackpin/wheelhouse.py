"""The offline wheelhouse: fetch binary wheels for a cell's target, hash them, verify them.

Layout: ``wheels/<cell>/`` holds what ``pip download`` fetched for the cell's CPython, ABI
and platform (never the host's); ``wheels/vendor/`` holds the vendor wheels a user drops in
by hand (DTK torch, DTK FlashAttention), shared by every cell. The lock names the file each
build installs, so a wheel present but unlocked is never installed.

Commands run through a ``Runner`` (argv, line callback) -> exit code: the one seam tests
replace, as tox does with its executor.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stackpin.errors import HostEnvironmentError, ValidationError
from stackpin.lock import Lock, build_lock, read_lock, stale_reason, wheel_name_version
from stackpin.matrix import Cell, PinnedWheel
from stackpin.primitives import CHUNK

Runner = Callable[[list[str], Callable[[str], None]], int]
LineSink = Callable[[str], None]



def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def cell_dir(root: Path, cell_id: str) -> Path:
    return root / "wheels" / cell_id


def vendor_dir(root: Path) -> Path:
    return root / "wheels" / "vendor"


def target_platforms(cell: Cell) -> list[str]:
    """pip --platform values for the cell: every manylinux tag its glibc floor admits.

    pip matches --platform tags literally, so each manylinux_2_N up to the cell's glibc is
    listed along with the legacy aliases.
    """
    arch = cell.cpu_arch
    major, minor = (int(p) for p in cell.glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)]
    legacy = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
    tags += [f"{name}_{arch}" for name, floor in legacy.items() if floor <= minor]
    return tags


def python_version(cell: Cell) -> str:
    digits = cell.python.removeprefix("cp")
    return f"{digits[0]}.{digits[1:]}"


def pip_download_argv(
    cell: Cell, *, dest: Path, requirements: Path, with_deps: bool, python: str = sys.executable
) -> list[str]:
    """The pip command that fetches the cell's wheels for its target, not for this host."""
    argv = [
        python, "-m", "pip", "download", "--disable-pip-version-check",
        "--only-binary=:all:", "--implementation", "cp",
        "--python-version", python_version(cell), "--abi", cell.python, "--abi", "abi3",
        "--abi", "none",
    ]
    for tag in target_platforms(cell):
        argv += ["--platform", tag]
    argv += ["--dest", str(dest), "-r", str(requirements)]
    if not with_deps:
        # Locked mode: the lock already names every wheel; pip must not resolve anything.
        argv += ["--no-deps", "--require-hashes"]
    return argv


def resolve_requirements(cell: Cell, vendor_files: Mapping[str, Path]) -> str:
    """Requirements for a first resolution: index pins by version, vendor wheels by path."""
    lines = []
    for wheel in _pins(cell):
        if wheel.source == "vendor":
            lines.append(str(vendor_files[wheel.filename]))
        else:
            name, version = wheel_name_version(wheel.filename)
            lines.append(f"{name}=={version}")
    lines += [f"{dist}=={version}" for dist, version in sorted(cell.stack.items())]
    return "\n".join(lines) + "\n"


def locked_requirements(lock: Lock) -> str:
    """Requirements that re-download exactly the lock's index wheels, hash-checked."""
    lines = [
        f"{w.name}=={w.version} --hash=sha256:{w.sha256}"
        for w in lock.wheels
        if w.source == "index"
    ]
    return "\n".join(lines) + "\n"


def _pins(cell: Cell) -> list[PinnedWheel]:
    pins = [cell.torch, *cell.vendor_wheels]
    if cell.attention is not None and cell.locks_attention:
        pins.append(cell.attention)
    return pins


def vendor_files(cell: Cell, root: Path) -> dict[str, Path]:
    """The cell's vendor wheels in wheels/vendor/, or an error naming the missing file."""
    found = {}
    for wheel in _pins(cell):
        if wheel.source != "vendor":
            continue
        path = vendor_dir(root) / wheel.filename
        if not path.is_file():
            msg = (
                f"vendor wheel {wheel.filename} for cell {cell.id} is missing: put the exact "
                f"file in {vendor_dir(root)}/ (it cannot be downloaded from a public index)"
            )
            raise HostEnvironmentError(msg)
        found[wheel.filename] = path
    return found


def scan(cell: Cell, root: Path) -> dict[str, str]:
    """filename -> sha256 of the cell's downloaded wheels plus its vendor wheels."""
    listing = {p.name: sha256_file(p) for p in sorted(cell_dir(root, cell.id).glob("*.whl"))}
    for name, path in vendor_files(cell, root).items():
        listing[name] = sha256_file(path)
    return listing


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
    for wheel in lock.wheels:
        try:
            actual = sha256_file(locate(root, lock.cell, wheel.filename))
        except HostEnvironmentError:
            actual = ""
        if actual != wheel.sha256:
            problems.append(Mismatch(filename=wheel.filename, expected=wheel.sha256, actual=actual))
    return problems


def subprocess_runner(argv: list[str], on_line: LineSink) -> int:
    """Run a command, passing each output line on as it arrives."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        return proc.wait()


@dataclass(frozen=True, kw_only=True)
class FetchResult:
    lock: Lock
    mode: str  # "locked" (re-download by hash) or "resolved" (new resolution)
    wheel_count: int
    bytes: int


def fetch(
    cell: Cell,
    root: Path,
    *,
    base_reference: str,
    runner: Runner = subprocess_runner,
    on_line: LineSink = lambda _line: None,
) -> FetchResult:
    """Fill wheels/<cell>/ for the cell's target and write its lock.

    With a current lock the download is hash-locked (--no-deps --require-hashes); without
    one pip resolves the stack once and the result becomes the lock. The folder is swapped
    in whole only after pip succeeded, so a failed fetch leaves the old wheelhouse intact.
    """
    vendors = vendor_files(cell, root)
    lock = read_lock(root, cell.id)
    locked = lock is not None and stale_reason(lock, cell) is None
    target = cell_dir(root, cell.id)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{cell.id}.", dir=target.parent) as tmp:
        staging = Path(tmp) / "wheels"
        staging.mkdir()
        requirements = Path(tmp) / "requirements.txt"
        text = locked_requirements(lock) if locked and lock else resolve_requirements(cell, vendors)
        requirements.write_text(text, encoding="utf-8")
        argv = pip_download_argv(
            cell, dest=staging, requirements=requirements, with_deps=not locked
        )
        on_line(f"pip download for {cell.python} / {cell.cpu_arch} / glibc {cell.glibc}")
        if runner(argv, on_line) != 0:
            msg = (
                f"pip download failed for cell {cell.id}; the output above names the wheel "
                "pip could not find for this target (check the pins and the index)"
            )
            raise HostEnvironmentError(msg)
        for name in vendors:  # pip copies path requirements; the vendor folder keeps them
            (staging / name).unlink(missing_ok=True)
        _swap_in(staging, target, Path(tmp) / "old")
    listing = scan(cell, root)
    new_lock = build_lock(cell, listing, base_reference=base_reference)
    size = sum(p.stat().st_size for p in target.glob("*.whl"))
    return FetchResult(
        lock=new_lock, mode="locked" if locked else "resolved", wheel_count=len(listing), bytes=size
    )


def _swap_in(staging: Path, target: Path, old: Path) -> None:
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def require_complete(lock: Lock, cell: Cell, root: Path) -> None:
    """Refuse a build whose lock is incomplete or not what the wheelhouse holds.

    The lock is current already: stackpin.target checked that once for the verb.
    """
    if lock.missing:
        msg = f"{cell.id}: the lock lacks {lock.missing[0]}; put it in wheels/vendor/ and re-fetch"
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
