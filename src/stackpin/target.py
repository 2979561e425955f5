"""What a verb works on, resolved once: cell x variant x current lock, its tags and paths.

Every verb that touches one cell starts here. The matrix that holds the cell is the only
one decoded, the lock is read and checked for staleness once, and what follows from the
three (image tags, label keys, the ``build/`` layout) has its single home in this module,
so build, verify, rebuild and bundle cannot disagree about a tag or a path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from stackpin.errors import ConfigurationError, LockMissingError, LockStaleError
from stackpin.lock import Lock, read_lock, stale_reason
from stackpin.matrix import VARIANTS, Cell, Variant
from stackpin.matrixfile import decode_matrix, find_cell, load_cells, parse_toml

# Every label key stackpin writes or reads, here and nowhere else (the site scripts and
# scripts/*.sh spell some of them in bash: tests/unit/test_parity.py holds them equal).
# Label keys an image carries; `stackpin images`, bundles and normalisation read them.
LABEL_PREFIX = "io.stackpin"
LABEL_CELL = f"{LABEL_PREFIX}.cell"
LABEL_VARIANT = f"{LABEL_PREFIX}.variant"
LABEL_PLATFORM = f"{LABEL_PREFIX}.platform"
LABEL_ATTENTION = f"{LABEL_PREFIX}.attention"
LABEL_CELL_JSON = f"{LABEL_PREFIX}.cell-json"
LABEL_LOCK_DIGEST = f"{LABEL_PREFIX}.lock-digest"
LABEL_SOURCE_DATE_EPOCH = f"{LABEL_PREFIX}.source-date-epoch"
LABEL_VERSION = f"{LABEL_PREFIX}.version"
LABEL_SOURCE_COMMIT = f"{LABEL_PREFIX}.source-commit"
LABEL_BOOTSTRAP_DIGEST = f"{LABEL_PREFIX}.bootstrap-digest"
# A vendor rehearsal image (stand-in vendor files): bundle export refuses it unless asked.
LABEL_REHEARSAL = f"{LABEL_PREFIX}.rehearsal"
# What the build made, so a bundle can tell the record belongs to the image.
LABEL_DOCKERFILE_SHA256 = f"{LABEL_PREFIX}.dockerfile-sha256"
LABEL_CONTEXT_DIGEST = f"{LABEL_PREFIX}.context-digest"
# Containers: the profile a service runs as and its state folder (`stackpin serve`,
# bin/start.sh), and the bundle image a site container was started from (bin/start.sh).
LABEL_PROFILE = f"{LABEL_PREFIX}.profile"
LABEL_STATE = f"{LABEL_PREFIX}.state"
LABEL_BUNDLE_IMAGE = f"{LABEL_PREFIX}.bundle-image"
# The OCI annotations (image-spec annotations.md) an image carries.
OCI_PREFIX = "org.opencontainers.image"
OCI_TITLE = f"{OCI_PREFIX}.title"
OCI_DESCRIPTION = f"{OCI_PREFIX}.description"
OCI_VERSION = f"{OCI_PREFIX}.version"
OCI_CREATED = f"{OCI_PREFIX}.created"
OCI_VENDOR = f"{OCI_PREFIX}.vendor"
OCI_BASE_NAME = f"{OCI_PREFIX}.base.name"
OCI_BASE_DIGEST = f"{OCI_PREFIX}.base.digest"
OCI_REVISION = f"{OCI_PREFIX}.revision"
OCI_REF_NAME = f"{OCI_PREFIX}.ref.name"
# Beside a report: which image it is about (`stackpin verify`); not a report itself.
VERIFIED_NAME = "verified.json"


def image_tags(cell_id: str, variant: Variant, lock_digest: str) -> tuple[str, ...]:
    """A built image's tags: variant plus 12 hex of the lock digest, then the moving tag.

    The digest tag comes first (it names exactly what was installed); an unlocked cell
    (CI matrix before the first fetch) has only the moving tag.
    """
    repo = f"stackpin/{cell_id}"
    hex_digest = lock_digest.removeprefix("sha256:")
    moving = f"{repo}:{variant}"
    return (f"{repo}:{variant}-{hex_digest[:12]}", moving) if hex_digest else (moving,)


@dataclass(frozen=True)
class Layout:
    """Where a checkout keeps its inputs and outputs (README: Layout)."""

    root: Path

    @property
    def templates(self) -> Path:
        return self.root / "templates"

    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def reports(self) -> Path:
        return self.build / "reports"

    @property
    def tmp(self) -> Path:
        return self.build / "tmp"

    def matrix_files(self) -> list[Path]:
        return sorted((self.root / "pinning").glob("*.toml"))

    def context_dir(self, cell_id: str, variant: Variant) -> Path:
        return self.build / "context" / f"{cell_id}-{variant}"

    def log_path(self, cell_id: str, variant: Variant, suffix: str = "") -> Path:
        return self.build / "logs" / f"{cell_id}-{variant}{suffix}.log"

    def record_path(self, cell_id: str, variant: Variant) -> Path:
        return self.build / "records" / f"{cell_id}-{variant}.json"

    def dockerfile_record_path(self, cell_id: str, variant: Variant) -> Path:
        """The Dockerfile a build used, kept beside its record (bundles ship this one)."""
        return self.build / "records" / f"{cell_id}-{variant}.Dockerfile"

    def report_dir(self, cell_id: str, variant: Variant) -> Path:
        return self.reports / f"{cell_id}-{variant}"

    def verified_path(self, cell_id: str, variant: Variant) -> Path:
        """Which image the reports in report_dir are about (written by `stackpin verify`)."""
        return self.report_dir(cell_id, variant) / VERIFIED_NAME


@dataclass(frozen=True, kw_only=True)
class Target:
    """One cell x variant with its current lock, as every verb after `wheels fetch` sees it."""

    cell: Cell
    variant: Variant
    lock: Lock
    layout: Layout

    @property
    def tags(self) -> tuple[str, ...]:
        return image_tags(self.cell.id, self.variant, self.lock.digest)

    @property
    def name(self) -> str:
        """cell-variant: the stem of every file the build writes about this target."""
        return f"{self.cell.id}-{self.variant}"

    @property
    def context_dir(self) -> Path:
        return self.layout.context_dir(self.cell.id, self.variant)

    @property
    def log_path(self) -> Path:
        return self.layout.log_path(self.cell.id, self.variant)

    @property
    def record_path(self) -> Path:
        return self.layout.record_path(self.cell.id, self.variant)

    @property
    def report_dir(self) -> Path:
        return self.layout.report_dir(self.cell.id, self.variant)


def load_cell(layout: Layout, cell_id: str) -> Cell:
    """The cell with this id, decoding only the matrix file that declares it.

    The TOML of every file is parsed (cheap) to find the holder; an unknown id falls back
    to decoding all of them for the did-you-mean hint. A rehearsal cell is derived from the
    real cell it rehearses (stackpin.rehearsal), never read from a file.
    """
    files = layout.matrix_files()
    from stackpin import rehearsal  # it derives cells from these, so it imports this module

    if rehearsal.is_rehearsal_id(cell_id):
        cells = load_cells(files)
        return find_cell(rehearsal.load_derived(layout.root, cells), cell_id)
    holders = [(path, data) for path in files
               if cell_id in (data := parse_toml(path)).get("cells", {})]
    if len(holders) > 1:
        msg = f"cell '{cell_id}' is in both {holders[0][0]} and {holders[1][0]}; rename one"
        raise ConfigurationError(msg)
    if not holders:
        return find_cell(load_cells(files), cell_id)
    path, data = holders[0]
    return decode_matrix(data, source=str(path)).cells[cell_id]


def optional_lock(layout: Layout, cell: Cell) -> Lock | None:
    """The cell's lock when there is one; a stale one is refused (LockStaleError)."""
    lock = read_lock(layout.root, cell.id)
    if lock is not None and (reason := stale_reason(lock, cell)):
        raise LockStaleError(cell.id, reason)
    return lock


def current_lock(layout: Layout, cell: Cell) -> Lock:
    """The cell's lock, which must exist (LockMissingError) and be current (LockStaleError)."""
    lock = optional_lock(layout, cell)
    if lock is None:
        raise LockMissingError(cell.id)
    return lock


def variant_choices(*, allow_all: bool) -> tuple[str, ...]:
    names = tuple(v.value for v in VARIANTS)
    return (*names, "all") if allow_all else names


def selected_variants(cell: Cell, choice: str) -> tuple[Variant, ...]:
    """The variants a --variant choice means for a cell ('all' = every one it builds)."""
    if choice == "all":
        return cell.variants
    if choice not in cell.variants:
        msg = f"cell '{cell.id}' builds {', '.join(cell.variants)}, not '{choice}'"
        raise ConfigurationError(msg + f"; use --variant {cell.variants[0]}")
    return (Variant(choice),)


def resolve(
    layout: Layout, cell_id: str, variant_choice: str,
    *, vet: Callable[[Cell], None] = lambda _cell: None,
) -> tuple[Target, ...]:
    """Every target a verb's CELL and --variant name: one cell load, one lock check.

    ``vet`` checks the cell before its lock is read (a build's matrix rules), so the
    root cause is reported rather than the missing lock it leads to.
    """
    cell = load_cell(layout, cell_id)
    variants = selected_variants(cell, variant_choice)
    vet(cell)
    lock = current_lock(layout, cell)
    return tuple(Target(cell=cell, variant=v, lock=lock, layout=layout) for v in variants)


def resolve_many(
    layout: Layout, cell_ids: Sequence[str], variant_choice: str
) -> tuple[Target, ...]:
    """Targets of several cells (bundle export), each cell resolved once."""
    return tuple(t for cell_id in dict.fromkeys(cell_ids)
                 for t in resolve(layout, cell_id, variant_choice))
