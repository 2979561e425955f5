"""Settings declared once, as dataclass fields with a ``help`` text, and all they drive.

One declaration gives the decoding of parsed TOML (types, defaults, unknown keys with a
did-you-mean hint; every problem of a file collected, not just the first), the JSON
Schema, and the rows of a reference table. ``stackpin.matrix`` declares the matrix with
it; nothing here knows what a matrix is.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from stackpin.untrusted import shown


def doc(text: str, **extra: Any) -> dict[str, Any]:
    """A field's metadata: its help text, plus ``from_key`` (the field is its table's key)
    or ``slot`` (how the reference names the keys of a table of tables, e.g. <id>)."""
    return {"help": text, **extra}


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


@dataclass(frozen=True)
class OneOf:
    """``Annotated[str, OneOf(values)]``: a string whose allowed spellings come from a
    registry, asked each time (the platforms package: a new module adds a spelling)."""

    values: Callable[[], tuple[str, ...]]


def hints(cls: Any) -> dict[str, Any]:
    """A dataclass's field types, ``Annotated`` markers kept."""
    return typing.get_type_hints(cls, include_extras=True)


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def _choices(tp: Any) -> tuple[str, ...] | None:
    """The spellings a Literal or an Enum type allows; None for any other type."""
    if get_origin(tp) is Literal:
        return tuple(str(a) for a in get_args(tp))
    if get_origin(tp) is Annotated:
        marks = [m for m in tp.__metadata__ if isinstance(m, OneOf)]
        return marks[0].values() if marks else None
    if _is_enum(tp):
        return tuple(str(m.value) for m in tp)
    return None


def _type_name(value: Any) -> str:
    return {str: "string", int: "integer", bool: "boolean", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


class Decoder:
    """Decodes parsed TOML into declared types, recording every problem it meets."""

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
                hint = did_you_mean(str(value), list(choices))
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
        types_of = hints(cls)
        dotted = f"{path}." if path else ""
        for key in sorted(set(value) - set(fields)):
            settable = [n for n, f in fields.items() if not f.metadata.get("from_key")]
            self.fail(f"{dotted}{key}", f"unknown key{did_you_mean(key, settable)}")
        kwargs: dict[str, Any] = {}
        for name, fld in fields.items():
            if name not in value:
                if is_required(fld):
                    self.fail(f"{dotted}{name}", "required key is missing")
                continue
            kwargs[name] = self.decode(types_of[name], value[name], f"{dotted}{name}")
        missing = any(is_required(f) and n not in kwargs for n, f in fields.items())
        if missing or any(v is _INVALID for v in kwargs.values()):
            return _INVALID
        return cls(**kwargs)


def is_required(fld: dataclasses.Field[Any]) -> bool:
    return fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING


def did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (perhaps you meant '{close[0]}'?)" if close else ""


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in sorted(value.items())}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


# --- JSON Schema, generated from the same declarations ---------------------------------


# --- JSON Schema and reference rows, generated from the same declarations ------------------


def schema_of(tp: Any, description: str = "") -> dict[str, Any]:
    optional, inner = _is_optional(tp)
    origin = get_origin(inner)
    out: dict[str, Any]
    if dataclasses.is_dataclass(inner):
        out = _dataclass_schema(inner)
    elif (choices := _choices(inner)) is not None:
        out = {"enum": list(choices)}
    elif origin is tuple:
        out = {"type": "array", "items": schema_of(get_args(inner)[0])}
    elif origin in (Mapping, dict, typing.Mapping):
        out = {"type": "object", "additionalProperties": schema_of(get_args(inner)[1])}
    else:
        out = {"type": {str: "string", int: "integer", bool: "boolean"}[inner]}
    if optional and "type" in out:
        out["type"] = [out["type"], "null"]
    if description:
        out["description"] = description
    return out


def _dataclass_schema(cls: Any) -> dict[str, Any]:
    types_of = hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for fld in dataclasses.fields(cls):
        if fld.metadata.get("from_key"):
            continue
        prop = schema_of(types_of[fld.name], fld.metadata.get("help", ""))
        default = _default_of(fld)
        if default is not dataclasses.MISSING and not dataclasses.is_dataclass(default):
            prop["default"] = plain(default)
        properties[fld.name] = prop
        if is_required(fld):
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


def reference_rows(cls: Any, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every setting, for docs/matrix.md."""
    rows: list[tuple[str, str, str, str]] = []
    types_of = hints(cls)
    for fld in dataclasses.fields(cls):
        if fld.metadata.get("from_key"):
            continue
        tp = types_of[fld.name]
        _, inner = _is_optional(tp)
        key = f"{prefix}{fld.name}"
        if get_origin(inner) in (Mapping, typing.Mapping) and dataclasses.is_dataclass(
            get_args(inner)[1]
        ):
            rows.append((key, "table of tables", "", fld.metadata.get("help", "")))
            slot = fld.metadata.get("slot", "<name>")
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
        default = "" if is_required(fld) else _shown_default(_default_of(fld))
        rows.append((key, _describe_type(tp), default, fld.metadata.get("help", "")))
    return rows


def _default_of(fld: dataclasses.Field[Any]) -> Any:
    if fld.default_factory is not dataclasses.MISSING:
        return fld.default_factory()
    return fld.default


def _shown_default(default: Any) -> str:
    """The default as TOML users write it: ('stable',), not the enum members' repr."""
    if isinstance(default, tuple):
        return repr(tuple(plain(v) for v in default))
    return repr(plain(default))


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
