"""Load pinned ABI matrices (``pinning/*.toml``) into frozen, typed cells.

Each setting is declared once, as a dataclass field with a ``help`` text. That one
declaration drives decoding (types, defaults, unknown keys with a did-you-mean hint),
the JSON Schema (``stackpin matrix schema``) and the reference in docs/matrix.md, all
through ``stackpin.declared``. Decoding collects every problem of a file instead of
stopping at the first one, so a release engineer fixes a matrix in one pass.
"""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stackpin.compat import Compat, compat_problems
from stackpin.declared import Decoder, Problem, did_you_mean, doc, plain, schema_of
from stackpin.declared import reference_rows as declared_rows
from stackpin.errors import ConfigurationError
from stackpin.matrix_safety import cell_problems, duplicate_ids
from stackpin.primitives import canonical_json
from stackpin.rehearsalspec import Rehearsal
from stackpin.servicespec import Service, ServiceBlocker, service_problems
from stackpin.untrusted import MAX_DEPTH, depth, read_bounded, shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SCHEMA_VERSION = 1

Platform = Literal["dtk", "rocm", "cuda", "cpu"]
WheelSource = Literal["index", "vendor"]
BitsAndBytes = Literal["disabled", "index", "vendor"]
ProvidedBy = Literal["vendor-wheel", "base-image"]


class Variant(str, enum.Enum):
    """Which image of a cell: stable (SDPA attention) or enhanced (FlashAttention wheel).

    A str so that tags, paths, labels and JSON spell it as its value ("stable"); the
    hash is the value's, so maps keyed by the plain string find it too.
    """

    STABLE = "stable"
    ENHANCED = "enhanced"

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


VARIANTS: tuple[Variant, ...] = tuple(Variant)
MAX_MATRIX_BYTES = 4 << 20
# Bounds of every key and value of a matrix file (parse_toml): far above any real setting.
MAX_VALUE_CHARS = 4096
MAX_INT = 1 << 63


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """A Debian rootfs built from packages with mmdebstrap (no registry needed)."""

    suite: str = field(metadata=doc("Debian suite, e.g. bookworm."))
    mirror: str = field(metadata=doc("Debian mirror URL the rootfs is built from."))
    packages: tuple[str, ...] = field(
        default=(), metadata=doc("Extra Debian packages in the rootfs (python3, python3-venv).")
    )
    mmdebstrap_variant: str = field(
        default="minbase", metadata=doc("mmdebstrap --variant (minbase keeps the base small).")
    )


@dataclass(frozen=True, kw_only=True)
class Base:
    """Where the image starts: a registry reference (optionally digest-pinned) or a bootstrap."""

    image: str = field(
        default="", metadata=doc("Image reference, e.g. vendor/dtk:26.04-ubuntu22.04-py3.10.")
    )
    digest: str = field(
        default="", metadata=doc("sha256:<64 hex> the base must resolve to; empty = unpinned.")
    )
    bootstrap: Bootstrap | None = field(
        default=None, metadata=doc("Build the base from Debian packages instead of an image.")
    )


@dataclass(frozen=True, kw_only=True)
class PinnedWheel:
    """One wheel file pinned by exact filename and sha256."""

    filename: str = field(metadata=doc("Exact wheel filename, never renamed to force a fit."))
    sha256: str = field(default="", metadata=doc("64 hex digits; empty = unpinned (warned)."))
    source: WheelSource = field(
        default="vendor",
        metadata=doc("'index' = downloadable from the package index; 'vendor' = dropped by hand."),
    )
    extras: tuple[str, ...] = field(default=(), metadata=doc(
        "Extras resolved with it (PEP 508 names), e.g. cu13: flash-attn-4's CUDA 13 DSL "
        "libraries; what they pull in joins the wheel's layer."))


@dataclass(frozen=True, kw_only=True)
class Provided:
    """A distribution the vendor wheels or the base image supply: never resolved from an index.

    While resolving, a metadata-only placeholder wheel (this name, this version, these
    requirements, no files) stands in for it, so the resolver treats the vendor build as
    installed; the lock records who provides it.
    """

    id: str = field(metadata=doc("Distribution name (the table key).", from_key=True))
    version: str = field(
        metadata=doc("Exact version with the vendor's local label, e.g. 2.9.0+das.opt1.dtk2604.")
    )
    by: ProvidedBy = field(
        default="vendor-wheel",
        metadata=doc(
            "vendor-wheel: a pinned vendor file of the cell (torch, attention, vendor_wheels); "
            "base-image: the base image's interpreter already has it."
        ),
    )
    requires: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "Its requirements as the vendor's metadata declares them (PEP 508), so the "
            "resolver adds what it needs from the index (filelock, sympy, ...)."
        ),
    )
    placeholder: bool = field(
        default=False,
        metadata=doc(
            "True when this exact label was not seen in a public source: the vendor file you "
            "receive decides; re-pin from its name (warned)."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class DroppedRequirement:
    """One requirement of one distribution that this cell does not install (--no-deps)."""

    of: str = field(metadata=doc("The distribution whose requirement is dropped, e.g. unsloth."))
    requirement: str = field(metadata=doc("The required distribution's name, e.g. xformers."))
    reason: str = field(metadata=doc("One line: why the cell runs without it."))


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """Container run flags for the platform; broad flags stay explicit opt-ins."""

    devices: tuple[str, ...] = field(default=(), metadata=doc("Device nodes passed through."))
    group_add: tuple[str, ...] = field(default=(), metadata=doc("Extra groups (video)."))
    volumes: tuple[str, ...] = field(
        default=(), metadata=doc("host:container[:ro] mounts, e.g. /opt/hyhal:/opt/hyhal:ro.")
    )
    shm_size: str = field(default="", metadata=doc("Shared memory size, e.g. 32g."))
    gpus: str = field(default="", metadata=doc("CUDA GPU request ('all'); empty = none."))
    ipc: str = field(default="", metadata=doc("IPC mode (host for multi-card); empty = default."))
    cap_add: tuple[str, ...] = field(default=(), metadata=doc("Added capabilities (SYS_PTRACE)."))
    security_opt: tuple[str, ...] = field(default=(), metadata=doc("Security options."))
    ulimits: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "Resource limits as docker's --ulimit takes them, NAME=SOFT[:HARD] with -1 for "
            "unlimited: the field runs DCU training with memlock=-1:-1 and stack=-1:-1."
        ),
    )
    visible_devices: str = field(
        default="",
        metadata=doc(
            "Cards the container may use, e.g. 0,1: set as HIP_VISIBLE_DEVICES on dtk/rocm "
            "(the HIP runtime reads that, not CUDA_VISIBLE_DEVICES), CUDA_VISIBLE_DEVICES on "
            "cuda; empty = every card passed through."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One ABI combination: everything an image of it is built from."""

    id: str = field(metadata=doc("Stable cell id (the table key).", from_key=True))
    description: str = field(default="", metadata=doc("One line for humans."))
    platform: Platform = field(metadata=doc("Accelerator platform."))
    platform_version: str = field(
        default="", metadata=doc("DTK / ROCm / CUDA version, e.g. 26.04, 6.4, 12.8; empty on cpu.")
    )
    arch: tuple[str, ...] = field(
        default=(), metadata=doc("Accelerator ISAs, e.g. gfx928, gfx936, sm_90.")
    )
    cpu_arch: str = field(default="x86_64", metadata=doc("CPU architecture of the image."))
    python: str = field(metadata=doc("CPython tag, e.g. cp310."))
    glibc: str = field(metadata=doc("glibc of the base; wheels must not need a newer one."))
    variants: tuple[Variant, ...] = field(
        default=(Variant.STABLE,),
        metadata=doc("Variants built: stable (SDPA), enhanced (FlashAttention)."),
    )
    source_date_epoch: int = field(
        default=0, metadata=doc("SOURCE_DATE_EPOCH for every timestamp in the image.")
    )
    base: Base = field(metadata=doc("The base image."))
    torch: PinnedWheel = field(metadata=doc("The torch wheel (vendor build on DTK)."))
    attention: PinnedWheel | None = field(
        default=None, metadata=doc("FlashAttention wheel; enhanced variant only.")
    )
    vendor_wheels: tuple[PinnedWheel, ...] = field(
        default=(), metadata=doc("Other ABI-bound wheels installed with --no-deps (triton, vllm).")
    )
    numpy: str = field(metadata=doc("numpy constraint, e.g. <2."))
    stack: Mapping[str, str] = field(
        metadata=doc("Distribution name to exact version for the rest of the stack.")
    )
    provided: Mapping[str, Provided] = field(
        default_factory=dict,
        metadata=doc("Distributions the vendor wheels or base image supply (see Provided)."),
    )
    excluded: Mapping[str, str] = field(
        default_factory=dict,
        metadata=doc(
            "Distribution name to a one-line reason: never installed in this cell; "
            "errors repeat the reason."
        ),
    )
    dropped: tuple[DroppedRequirement, ...] = field(
        default=(),
        metadata=doc("Requirements the cell drops, each with a reason (the field's --no-deps)."),
    )
    bitsandbytes: BitsAndBytes = field(
        default="index",
        metadata=doc("disabled: no 4/8-bit support is advertised (DTK default); index or vendor."),
    )
    env: Mapping[str, str] = field(
        default_factory=dict, metadata=doc("Runtime environment variables of the image.")
    )
    env_script: str = field(
        default="", metadata=doc("Script sourced in every build step and at start (DTK env.sh).")
    )
    run: RunFlags = field(default_factory=RunFlags, metadata=doc("Container run flags."))
    service: Service | None = field(
        default=None,
        metadata=doc("The service the image serves (Studio); none = a tool image only."),
    )
    service_blocked: ServiceBlocker | None = field(
        default=None,
        metadata=doc("Why the cell cannot serve Studio: the requirement that blocks it."),
    )
    compat: Mapping[str, Compat] = field(
        default_factory=dict,
        metadata=doc("Compatibility shims by id, each bridging one named upstream defect."),
    )
    rehearsal: Rehearsal | None = field(
        default=None,
        metadata=doc("Set only on a vendor rehearsal cell, which `stackpin rehearsal` derives "
                     "from a real cell; a matrix file that declares it is refused."),
    )

    @property
    def is_dtk(self) -> bool:
        return self.platform == "dtk"

    def uses_attention(self, variant: Variant) -> bool:
        """The attention wheel counts only for enhanced: the one home of that rule."""
        return variant == Variant.ENHANCED and self.attention is not None

    @property
    def locks_attention(self) -> bool:
        """Whether a variant this cell builds installs its attention wheel (so it is locked)."""
        return any(self.uses_attention(v) for v in self.variants)

    def wheels_for(self, variant: Variant) -> tuple[PinnedWheel, ...]:
        """The pinned ABI-bound wheels a variant installs with --no-deps, torch first."""
        wheels = (self.torch, *self.vendor_wheels)
        if self.uses_attention(variant) and self.attention is not None:
            wheels = (*wheels, self.attention)
        return wheels


def visibility_variable(platform: str) -> str:
    """The variable that chooses cards on this platform ("" on cpu): the HIP runtime reads
    HIP_VISIBLE_DEVICES, not CUDA_VISIBLE_DEVICES (dcu-facts.md)."""
    if platform == "cpu":
        return ""
    return "CUDA_VISIBLE_DEVICES" if platform == "cuda" else "HIP_VISIBLE_DEVICES"


def visibility_environment(platform: str, run: RunFlags) -> dict[str, str]:
    """The device-visibility variable of the run profile, named for the platform's runtime."""
    name = visibility_variable(platform)
    if not run.visible_devices or not name:
        return {}
    return {name: run.visible_devices}


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """One matrix file: a schema version and its cells."""

    schema_version: int = field(metadata=doc("Matrix format version; this stackpin reads 1."))
    description: str = field(default="", metadata=doc("What this file covers."))
    cells: Mapping[str, Cell] = field(metadata=doc("Cells by id.", slot="<id>"))


def _structural_problems(matrix: Matrix) -> list[Problem]:
    """Rules about single values that the type system cannot express."""
    problems: list[Problem] = []
    if matrix.schema_version != SCHEMA_VERSION:
        problems.append(
            Problem("schema_version", f"this stackpin reads version {SCHEMA_VERSION}")
        )
    for cell in matrix.cells.values():
        problems += cell_problems_of(cell)
        if cell.rehearsal is not None:
            # A stand-in is never written by hand: only derivation marks what it is.
            problems.append(Problem(f"cells.{cell.id}.rehearsal", "a rehearsal cell is derived "
                                    "from its real cell, never declared: `stackpin rehearsal "
                                    "list` shows them"))
    return problems


def cell_problems_of(cell: Cell) -> list[Problem]:
    """Every problem of one decoded cell's values (shapes, bounds, safe names).

    A cell with one is never resolved, locked or built: the verbs that act on a cell ask
    this before anything runs (``stackpin.checks.require_resolvable``).
    """
    problems: list[Problem] = []
    where = f"cells.{cell.id}"
    base = cell.base
    if bool(base.image) == (base.bootstrap is not None):
        problems.append(Problem(f"{where}.base", "set exactly one of 'image' or 'bootstrap'"))
    if base.digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", base.digest):
        problems.append(Problem(f"{where}.base.digest", "expected sha256:<64 hex digits>"))
    for wheel_path, wheel in _pinned_wheels(cell):
        if wheel.sha256 and not re.fullmatch(r"[0-9a-f]{64}", wheel.sha256):
            problems.append(Problem(f"{where}.{wheel_path}.sha256", "expected 64 hex digits"))
    if not cell.variants:
        problems.append(Problem(f"{where}.variants", "list at least one variant"))
    if cell.service is not None:
        problems += [Problem(f"{where}.service.{key}", message)
                     for key, message in service_problems(cell.service)]
    problems += [Problem(f"{where}.{key}", message) for key, message in compat_problems(cell)]
    problems += [Problem(path, message)
                 for path, message in cell_problems(cell, _pinned_wheels(cell))]
    return problems


def _pinned_wheels(cell: Cell) -> list[tuple[str, PinnedWheel]]:
    wheels = [("torch", cell.torch)]
    if cell.attention is not None:
        wheels.append(("attention", cell.attention))
    wheels += [(f"vendor_wheels[{i}]", w) for i, w in enumerate(cell.vendor_wheels)]
    return wheels


def pinned_wheels(cell: Cell) -> list[tuple[str, PinnedWheel]]:
    """Every pinned wheel of a cell with the matrix path that declares it."""
    return _pinned_wheels(cell)


def decode_matrix_lenient(data: Mapping[str, Any]) -> tuple[Matrix | None, list[Problem]]:
    """Decode as much as possible and return every problem found.

    An unknown key is a problem but does not stop its table from decoding, so ``matrix
    check`` can report a misspelled key together with the cross-check violations of the
    same cell in one run.
    """
    if oversized := _oversized(data):  # parse_toml refuses it first; other callers here
        return None, [Problem("matrix", f"{oversized}; no setting of a matrix is that large")]
    decoder = Decoder()
    matrix = decoder.decode(Matrix, dict(data), "")
    problems = decoder.problems
    if isinstance(matrix, Matrix):
        return matrix, problems + _structural_problems(matrix)
    return None, problems


def parse_toml(path: Path) -> dict[str, Any]:
    """Read a matrix file's TOML, with errors that name the file and how to fix it.

    The file must be a regular UTF-8 file of at most MAX_MATRIX_BYTES, nested at most
    MAX_DEPTH levels: a directory, /dev/zero or a nesting bomb is one line, not a hang.
    """
    if not path.exists():
        msg = f"{shown(path)}: no such matrix file; list the shipped ones with 'ls pinning/*.toml'"
        raise ConfigurationError(msg)
    data = read_bounded(path, limit=MAX_MATRIX_BYTES, what="matrix file", error=ConfigurationError)
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        msg = f"{shown(path)}: not UTF-8 (byte {exc.start}); save the matrix as UTF-8"
        raise ConfigurationError(msg) from None
    except tomllib.TOMLDecodeError as exc:
        msg = f"{shown(path)}: not valid TOML ({shown(exc)}); fix the syntax at that line"
        raise ConfigurationError(msg) from None
    except RecursionError:
        document = None
    except ValueError:  # tomllib's int() of a literal past Python's 4300-digit limit
        msg = f"{shown(path)}: an integer with thousands of digits: not a matrix"
        raise ConfigurationError(msg) from None
    if document is None or depth(document) > MAX_DEPTH:
        msg = f"{shown(path)}: nested more than {MAX_DEPTH} levels deep: not a matrix"
        raise ConfigurationError(msg)
    if oversized := _oversized(document):
        msg = f"{shown(path)}: {oversized}; no setting of a matrix is that large"
        raise ConfigurationError(msg)
    return document


def _oversized(document: Mapping[str, Any]) -> str | None:
    """The first key, string or integer beyond the matrix bounds, said in a few words.

    Bounding every value here, before decoding, is what lets every later parse (versions,
    tags, labels, ports) stay within Python's and packaging's limits: no string can hold
    a number near the 4300-digit conversion limit, no integer overflows a C long.
    """
    stack: list[Any] = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key in item:
                if len(key) > MAX_VALUE_CHARS:
                    return f"a key of {len(key)} characters ({shown(key, limit=40)})"
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and len(item) > MAX_VALUE_CHARS:
            return f"a string of {len(item)} characters ({shown(item, limit=40)})"
        elif isinstance(item, int) and not -MAX_INT <= item < MAX_INT:
            return f"an integer of {len(str(abs(item)))} digits"
    return None


def decode_matrix(data: Mapping[str, Any], *, source: str) -> Matrix:
    """Decode parsed TOML into a Matrix, or raise with every problem of the file."""
    matrix, problems = decode_matrix_lenient(data)
    if problems:
        lines = [f"{source}: {p}" for p in problems]
        msg = f"{source}: {len(problems)} problem(s) in the matrix; first: {problems[0]}"
        raise ConfigurationError(
            msg,
            details=lines,
        )
    assert isinstance(matrix, Matrix)
    return matrix


def load_matrix(path: Path) -> Matrix:
    """Read and decode one matrix file."""
    return decode_matrix(parse_toml(path), source=str(path))


def load_cells(paths: list[Path]) -> dict[str, Cell]:
    """Every cell of several matrix files by id; a duplicate id is a configuration error."""
    cells: dict[str, Cell] = {}
    files: list[tuple[str, list[str]]] = []
    for path in paths:
        matrix = load_matrix(path)
        files.append((str(path), list(matrix.cells)))
        cells.update(matrix.cells)
    duplicates = duplicate_ids(files)
    if duplicates:
        source, (where, message) = duplicates[0]
        msg = f"{shown(source)}: {where}: {message}"
        raise ConfigurationError(msg)
    return cells


def find_cell(cells: Mapping[str, Cell], cell_id: str) -> Cell:
    """The cell with this id, or a ConfigurationError that suggests the closest id."""
    if cell_id in cells:
        return cells[cell_id]
    hint = did_you_mean(cell_id, list(cells))
    msg = f"no cell '{cell_id}'{hint}; 'stackpin matrix list' shows every cell"
    raise ConfigurationError(msg)


def cell_to_dict(cell: Cell) -> dict[str, Any]:
    """Plain JSON-able form of a cell (stable key order), used for labels and locks.

    A cell that serves nothing has no ``service`` key (nor ``service_blocked`` unless it says
    why, nor ``rehearsal`` unless it is one), and settings added to the format later appear
    only where a cell sets them: a cell's form (hence its lock's digest) stays the one it had
    before they existed.
    """
    form: dict[str, Any] = plain(cell)
    for key in ("service", "service_blocked", "rehearsal"):
        if form[key] is None:
            del form[key]
    for table, key in LATER_SETTINGS:
        holder = form[table] if table else form
        if not holder[key]:
            del holder[key]
    # Likewise a pinned wheel without extras keeps the form it had before extras existed.
    for wheel in [form["torch"], form["attention"], *form["vendor_wheels"]]:
        if wheel is not None and not wheel["extras"]:
            del wheel["extras"]
    return form


# (table or "", key) of settings added after cells were first locked: omitted when unset.
LATER_SETTINGS: tuple[tuple[str, str], ...] = (("run", "ulimits"), ("", "compat"))


def cell_json(cell: Cell) -> str:
    """Canonical JSON of a cell: sorted keys, no spaces, so equal cells give equal bytes."""
    return canonical_json(cell_to_dict(cell), ascii_only=True)


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a matrix file, derived from the dataclass fields."""
    schema = schema_of(Matrix)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://stackpin.dev/schema/matrix-v1.json"
    schema["title"] = "stackpin ABI matrix"
    return schema




def reference_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every setting of a matrix file, for docs/matrix.md."""
    return declared_rows(Matrix)
