"""The pinned ABI matrix, declared: the cell, its typed ``Variant``, and their parts.

Each setting is declared once, as a dataclass field with a ``help`` text. That one
declaration drives decoding (types, defaults, unknown keys with a did-you-mean hint:
``stackpin.matrixfile`` reads the files), the JSON Schema (``stackpin matrix schema``) and
the reference in docs/matrix.md, all through ``stackpin.declared``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from stackpin import platforms
from stackpin.compat import Compat
from stackpin.declared import OneOf, doc, plain, schema_of
from stackpin.declared import reference_rows as declared_rows
from stackpin.primitives import canonical_json
from stackpin.rehearsalspec import Rehearsal
from stackpin.servicespec import Service, ServiceBlocker

SCHEMA_VERSION = 1

# One spelling per module of stackpin.platforms (a new module adds one).
Platform = Annotated[str, OneOf(platforms.names)]
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
    def spec(self) -> platforms.PlatformSpec:
        """Everything stackpin knows about the cell's platform (stackpin.platforms)."""
        return platforms.get(self.platform)

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
    """The variable that chooses cards on this platform ("" without cards): the HIP runtime
    reads HIP_VISIBLE_DEVICES, not CUDA_VISIBLE_DEVICES (dcu-facts.md)."""
    return platforms.get(platform).visibility_env


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


def pinned_wheels(cell: Cell) -> list[tuple[str, PinnedWheel]]:
    """Every pinned wheel of a cell with the matrix path that declares it."""
    wheels = [("torch", cell.torch)]
    if cell.attention is not None:
        wheels.append(("attention", cell.attention))
    wheels += [(f"vendor_wheels[{i}]", w) for i, w in enumerate(cell.vendor_wheels)]
    return wheels



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
