"""Load pinned ABI matrices (``pinning/*.toml``) into frozen, typed cells.

Each setting is declared once, as a dataclass field with a ``help`` text. That one
declaration drives decoding (types, defaults, unknown keys with a did-you-mean hint),
the JSON Schema (``stackpin matrix schema``) and the reference in docs/matrix.md.
Decoding collects every problem of a file instead of stopping at the first one, so a
release engineer fixes a matrix in one pass.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from stackpin.errors import ConfigurationError
from stackpin.matrix_safety import cell_problems, duplicate_ids
from stackpin.primitives import canonical_json
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


def _doc(text: str, **extra: Any) -> dict[str, Any]:
    return {"help": text, **extra}


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """A Debian rootfs built from packages with mmdebstrap (no registry needed)."""

    suite: str = field(metadata=_doc("Debian suite, e.g. bookworm."))
    mirror: str = field(metadata=_doc("Debian mirror URL the rootfs is built from."))
    packages: tuple[str, ...] = field(
        default=(), metadata=_doc("Extra Debian packages in the rootfs (python3, python3-venv).")
    )
    mmdebstrap_variant: str = field(
        default="minbase", metadata=_doc("mmdebstrap --variant (minbase keeps the base small).")
    )


@dataclass(frozen=True, kw_only=True)
class Base:
    """Where the image starts: a registry reference (optionally digest-pinned) or a bootstrap."""

    image: str = field(
        default="", metadata=_doc("Image reference, e.g. vendor/dtk:26.04-ubuntu22.04-py3.10.")
    )
    digest: str = field(
        default="", metadata=_doc("sha256:<64 hex> the base must resolve to; empty = unpinned.")
    )
    bootstrap: Bootstrap | None = field(
        default=None, metadata=_doc("Build the base from Debian packages instead of an image.")
    )


@dataclass(frozen=True, kw_only=True)
class PinnedWheel:
    """One wheel file pinned by exact filename and sha256."""

    filename: str = field(metadata=_doc("Exact wheel filename, never renamed to force a fit."))
    sha256: str = field(default="", metadata=_doc("64 hex digits; empty = unpinned (warned)."))
    source: WheelSource = field(
        default="vendor",
        metadata=_doc("'index' = downloadable from the package index; 'vendor' = dropped by hand."),
    )


@dataclass(frozen=True, kw_only=True)
class Provided:
    """A distribution the vendor wheels or the base image supply: never resolved from an index.

    While resolving, a metadata-only placeholder wheel (this name, this version, these
    requirements, no files) stands in for it, so the resolver treats the vendor build as
    installed; the lock records who provides it.
    """

    id: str = field(metadata=_doc("Distribution name (the table key).", from_key=True))
    version: str = field(
        metadata=_doc("Exact version with the vendor's local label, e.g. 2.9.0+das.opt1.dtk2604.")
    )
    by: ProvidedBy = field(
        default="vendor-wheel",
        metadata=_doc(
            "vendor-wheel: a pinned vendor file of the cell (torch, attention, vendor_wheels); "
            "base-image: the base image's interpreter already has it."
        ),
    )
    requires: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "Its requirements as the vendor's metadata declares them (PEP 508), so the "
            "resolver adds what it needs from the index (filelock, sympy, ...)."
        ),
    )
    placeholder: bool = field(
        default=False,
        metadata=_doc(
            "True when this exact label was not seen in a public source: the vendor file you "
            "receive decides; re-pin from its name (warned)."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class DroppedRequirement:
    """One requirement of one distribution that this cell does not install (--no-deps)."""

    of: str = field(metadata=_doc("The distribution whose requirement is dropped, e.g. unsloth."))
    requirement: str = field(metadata=_doc("The required distribution's name, e.g. xformers."))
    reason: str = field(metadata=_doc("One line: why the cell runs without it."))


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """Container run flags for the platform; broad flags stay explicit opt-ins."""

    devices: tuple[str, ...] = field(default=(), metadata=_doc("Device nodes passed through."))
    group_add: tuple[str, ...] = field(default=(), metadata=_doc("Extra groups (video)."))
    volumes: tuple[str, ...] = field(
        default=(), metadata=_doc("host:container[:ro] mounts, e.g. /opt/hyhal:/opt/hyhal:ro.")
    )
    shm_size: str = field(default="", metadata=_doc("Shared memory size, e.g. 32g."))
    gpus: str = field(default="", metadata=_doc("CUDA GPU request ('all'); empty = none."))
    ipc: str = field(default="", metadata=_doc("IPC mode (host for multi-card); empty = default."))
    cap_add: tuple[str, ...] = field(default=(), metadata=_doc("Added capabilities (SYS_PTRACE)."))
    security_opt: tuple[str, ...] = field(default=(), metadata=_doc("Security options."))
    visible_devices: str = field(
        default="",
        metadata=_doc(
            "Cards the container may use, e.g. 0,1: set as HIP_VISIBLE_DEVICES on dtk/rocm "
            "(the HIP runtime reads that, not CUDA_VISIBLE_DEVICES), CUDA_VISIBLE_DEVICES on "
            "cuda; empty = every card passed through."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One ABI combination: everything an image of it is built from."""

    id: str = field(metadata=_doc("Stable cell id (the table key).", from_key=True))
    description: str = field(default="", metadata=_doc("One line for humans."))
    platform: Platform = field(metadata=_doc("Accelerator platform."))
    platform_version: str = field(
        default="", metadata=_doc("DTK / ROCm / CUDA version, e.g. 26.04, 6.4, 12.8; empty on cpu.")
    )
    arch: tuple[str, ...] = field(
        default=(), metadata=_doc("Accelerator ISAs, e.g. gfx928, gfx936, sm_90.")
    )
    cpu_arch: str = field(default="x86_64", metadata=_doc("CPU architecture of the image."))
    python: str = field(metadata=_doc("CPython tag, e.g. cp310."))
    glibc: str = field(metadata=_doc("glibc of the base; wheels must not need a newer one."))
    variants: tuple[Variant, ...] = field(
        default=(Variant.STABLE,),
        metadata=_doc("Variants built: stable (SDPA), enhanced (FlashAttention)."),
    )
    source_date_epoch: int = field(
        default=0, metadata=_doc("SOURCE_DATE_EPOCH for every timestamp in the image.")
    )
    base: Base = field(metadata=_doc("The base image."))
    torch: PinnedWheel = field(metadata=_doc("The torch wheel (vendor build on DTK)."))
    attention: PinnedWheel | None = field(
        default=None, metadata=_doc("FlashAttention wheel; enhanced variant only.")
    )
    vendor_wheels: tuple[PinnedWheel, ...] = field(
        default=(), metadata=_doc("Other ABI-bound wheels installed with --no-deps (triton, vllm).")
    )
    numpy: str = field(metadata=_doc("numpy constraint, e.g. <2."))
    stack: Mapping[str, str] = field(
        metadata=_doc("Distribution name to exact version for the rest of the stack.")
    )
    provided: Mapping[str, Provided] = field(
        default_factory=dict,
        metadata=_doc("Distributions the vendor wheels or base image supply (see Provided)."),
    )
    excluded: Mapping[str, str] = field(
        default_factory=dict,
        metadata=_doc(
            "Distribution name to a one-line reason: never installed in this cell; "
            "errors repeat the reason."
        ),
    )
    dropped: tuple[DroppedRequirement, ...] = field(
        default=(),
        metadata=_doc("Requirements the cell drops, each with a reason (the field's --no-deps)."),
    )
    bitsandbytes: BitsAndBytes = field(
        default="index",
        metadata=_doc("disabled: no 4/8-bit support is advertised (DTK default); index or vendor."),
    )
    env: Mapping[str, str] = field(
        default_factory=dict, metadata=_doc("Runtime environment variables of the image.")
    )
    env_script: str = field(
        default="", metadata=_doc("Script sourced in every build step and at start (DTK env.sh).")
    )
    run: RunFlags = field(default_factory=RunFlags, metadata=_doc("Container run flags."))

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


def visibility_environment(platform: str, run: RunFlags) -> dict[str, str]:
    """The device-visibility variable of the run profile, named for the platform's runtime."""
    if not run.visible_devices or platform == "cpu":
        return {}
    name = "CUDA_VISIBLE_DEVICES" if platform == "cuda" else "HIP_VISIBLE_DEVICES"
    return {name: run.visible_devices}


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """One matrix file: a schema version and its cells."""

    schema_version: int = field(metadata=_doc("Matrix format version; this stackpin reads 1."))
    description: str = field(default="", metadata=_doc("What this file covers."))
    cells: Mapping[str, Cell] = field(metadata=_doc("Cells by id."))


@dataclass(frozen=True)
class Problem:
    """One decoding problem: where (dotted path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return shown(f"{self.path}: {self.message}", limit=2000)


class _Invalid:
    """Marker for a value that failed to decode; its problem is already recorded."""


_INVALID = _Invalid()


def _is_optional(tp: Any) -> tuple[bool, Any]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def _choices(tp: Any) -> tuple[str, ...] | None:
    """The spellings a Literal or an Enum type allows; None for any other type."""
    if get_origin(tp) is Literal:
        return tuple(str(a) for a in get_args(tp))
    if _is_enum(tp):
        return tuple(str(m.value) for m in tp)
    return None


def _type_name(value: Any) -> str:
    return {str: "string", int: "integer", bool: "boolean", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


class _Decoder:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def fail(self, path: str, message: str) -> _Invalid:
        self.problems.append(Problem(path, message))
        return _INVALID

    def decode(self, tp: Any, value: Any, path: str) -> Any:
        optional, inner = _is_optional(tp)
        if optional:
            return None if value is None else self.decode(inner, value, path)
        origin = get_origin(inner)
        if dataclasses.is_dataclass(inner):
            return self.decode_dataclass(inner, value, path)
        if (choices := _choices(inner)) is not None:
            if value not in choices:
                hint = _did_you_mean(str(value), list(choices))
                return self.fail(path, f"{value!r} is not one of {', '.join(choices)}{hint}")
            return inner(value) if _is_enum(inner) else value
        if origin is tuple:
            return self.decode_tuple(inner, value, path)
        if origin in (Mapping, dict, typing.Mapping):
            return self.decode_mapping(inner, value, path)
        return self.decode_scalar(inner, value, path)

    def decode_scalar(self, tp: Any, value: Any, path: str) -> Any:
        # bool is an int subclass in Python; TOML keeps them apart, so must we.
        if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
            return self.fail(path, f"expected an integer, found {_type_name(value)}")
        if not isinstance(value, tp):
            return self.fail(path, f"expected a {_type_name(tp())}, found {_type_name(value)}")
        return value

    def decode_tuple(self, tp: Any, value: Any, path: str) -> Any:
        if not isinstance(value, list):
            return self.fail(path, f"expected an array, found {_type_name(value)}")
        item_type = get_args(tp)[0]
        items = [self.decode(item_type, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return _INVALID if any(i is _INVALID for i in items) else tuple(items)

    def decode_mapping(self, tp: Any, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            return self.fail(path, f"expected a table, found {_type_name(value)}")
        _, value_type = get_args(tp)
        out: dict[str, Any] = {}
        for key in sorted(value):
            item = value[key]
            if dataclasses.is_dataclass(value_type):
                item = {**item, "id": key} if isinstance(item, dict) else item
            out[key] = self.decode(value_type, item, f"{path}.{key}" if path else key)
        if any(v is _INVALID for v in out.values()):
            return _INVALID
        return types.MappingProxyType(out)

    def decode_dataclass(self, cls: Any, value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            return self.fail(path, f"expected a table, found {_type_name(value)}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        dotted = f"{path}." if path else ""
        for key in sorted(set(value) - set(fields)):
            settable = [n for n, f in fields.items() if not f.metadata.get("from_key")]
            self.fail(f"{dotted}{key}", f"unknown key{_did_you_mean(key, settable)}")
        kwargs: dict[str, Any] = {}
        for name, fld in fields.items():
            if name not in value:
                if _is_required(fld):
                    self.fail(f"{dotted}{name}", "required key is missing")
                continue
            kwargs[name] = self.decode(hints[name], value[name], f"{dotted}{name}")
        missing = any(_is_required(f) and n not in kwargs for n, f in fields.items())
        if missing or any(v is _INVALID for v in kwargs.values()):
            return _INVALID
        return cls(**kwargs)


def _is_required(fld: dataclasses.Field[Any]) -> bool:
    return fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (perhaps you meant '{close[0]}'?)" if close else ""


def _structural_problems(matrix: Matrix) -> list[Problem]:
    """Rules about single values that the type system cannot express."""
    problems: list[Problem] = []
    if matrix.schema_version != SCHEMA_VERSION:
        problems.append(
            Problem("schema_version", f"this stackpin reads version {SCHEMA_VERSION}")
        )
    for cell in matrix.cells.values():
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
    for cell in matrix.cells.values():
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
    decoder = _Decoder()
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
    if document is None or depth(document) > MAX_DEPTH:
        msg = f"{shown(path)}: nested more than {MAX_DEPTH} levels deep: not a matrix"
        raise ConfigurationError(msg)
    return document


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
    hint = _did_you_mean(cell_id, list(cells))
    msg = f"no cell '{cell_id}'{hint}; 'stackpin matrix list' shows every cell"
    raise ConfigurationError(msg)


def cell_to_dict(cell: Cell) -> dict[str, Any]:
    """Plain JSON-able form of a cell (stable key order), used for labels and locks."""
    return _plain(cell)  # type: ignore[no-any-return]


def cell_json(cell: Cell) -> str:
    """Canonical JSON of a cell: sorted keys, no spaces, so equal cells give equal bytes."""
    return canonical_json(cell_to_dict(cell), ascii_only=True)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


# --- JSON Schema, generated from the same declarations ---------------------------------


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a matrix file, derived from the dataclass fields."""
    schema = _schema_for(Matrix)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://stackpin.dev/schema/matrix-v1.json"
    schema["title"] = "stackpin ABI matrix"
    return schema


def _schema_for(tp: Any, description: str = "") -> dict[str, Any]:
    optional, inner = _is_optional(tp)
    origin = get_origin(inner)
    out: dict[str, Any]
    if dataclasses.is_dataclass(inner):
        out = _dataclass_schema(inner)
    elif (choices := _choices(inner)) is not None:
        out = {"enum": list(choices)}
    elif origin is tuple:
        out = {"type": "array", "items": _schema_for(get_args(inner)[0])}
    elif origin in (Mapping, dict, typing.Mapping):
        out = {"type": "object", "additionalProperties": _schema_for(get_args(inner)[1])}
    else:
        out = {"type": {str: "string", int: "integer", bool: "boolean"}[inner]}
    if optional and "type" in out:
        out["type"] = [out["type"], "null"]
    if description:
        out["description"] = description
    return out


def _dataclass_schema(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for fld in dataclasses.fields(cls):
        if fld.metadata.get("from_key"):
            continue
        prop = _schema_for(hints[fld.name], fld.metadata.get("help", ""))
        default = _default_of(fld)
        if default is not dataclasses.MISSING and not dataclasses.is_dataclass(default):
            prop["default"] = _plain(default)
        properties[fld.name] = prop
        if _is_required(fld):
            required.append(fld.name)
    out: dict[str, Any] = {
        "type": "object",
        "description": (cls.__doc__ or "").strip(),
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        out["required"] = required
    return out


def reference_rows(cls: Any = Matrix, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every setting, for docs/matrix.md."""
    rows: list[tuple[str, str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for fld in dataclasses.fields(cls):
        if fld.metadata.get("from_key"):
            continue
        tp = hints[fld.name]
        _, inner = _is_optional(tp)
        key = f"{prefix}{fld.name}"
        if get_origin(inner) in (Mapping, typing.Mapping) and dataclasses.is_dataclass(
            get_args(inner)[1]
        ):
            rows.append((key, "table of tables", "", fld.metadata.get("help", "")))
            slot = "<id>" if fld.name == "cells" else "<name>"
            rows += reference_rows(get_args(inner)[1], f"{key}.{slot}.")
            continue
        if dataclasses.is_dataclass(inner):
            rows.append((key, "table", "", fld.metadata.get("help", "")))
            rows += reference_rows(inner, f"{key}.")
            continue
        if get_origin(inner) is tuple and dataclasses.is_dataclass(get_args(inner)[0]):
            rows.append((key, "array of tables", "[]", fld.metadata.get("help", "")))
            rows += reference_rows(get_args(inner)[0], f"{key}[].")
            continue
        default = "" if _is_required(fld) else _shown_default(_default_of(fld))
        rows.append((key, _describe_type(tp), default, fld.metadata.get("help", "")))
    return rows


def _default_of(fld: dataclasses.Field[Any]) -> Any:
    if fld.default_factory is not dataclasses.MISSING:
        return fld.default_factory()
    return fld.default


def _shown_default(default: Any) -> str:
    """The default as TOML users write it: ('stable',), not the enum members' repr."""
    if isinstance(default, tuple):
        return repr(tuple(_plain(v) for v in default))
    return repr(_plain(default))


def _describe_type(tp: Any) -> str:
    optional, inner = _is_optional(tp)
    origin = get_origin(inner)
    if (choices := _choices(inner)) is not None:
        text = " or ".join(repr(a) for a in choices)
    elif origin is tuple:
        text = f"array of {_describe_type(get_args(inner)[0])}"
    elif origin in (Mapping, typing.Mapping):
        text = "table of string"
    elif dataclasses.is_dataclass(inner):
        text = "table"
    else:
        text = {str: "string", int: "integer", bool: "boolean"}.get(inner, str(inner))
    return f"{text} (optional)" if optional else text
