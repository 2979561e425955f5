"""Shapes of untrusted JSON documents: small combinators, one error type.

A shape is a function ``(value, where) -> None`` that raises ``ShapeError(where, what)``
when ``value`` is not of that shape; ``conform`` turns that into the caller's one-line
StackpinError. The bundle manifest and the verification reports are checked with these
before any field is used, so a string where an object belongs is one line, never a
KeyError or TypeError further in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from stackpin.errors import StackpinError
from stackpin.untrusted import shown

MAX_TEXT = 4096


class ShapeError(Exception):
    """Raised by a shape: where in the document, and what is wrong there."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where} {what}")
        self.where = where
        self.what = what


Shape = Callable[[Any, str], None]


def conform(shape: Shape, value: Any, error: Callable[[str], StackpinError]) -> None:
    """Check ``value`` against ``shape``; a mismatch becomes ``error(problem)``."""
    try:
        shape(value, "")
    except ShapeError as exc:
        problem = f"{exc.where}: {exc.what}" if exc.where else exc.what
        raise error(problem) from None


def text(*, pattern: re.Pattern[str] | None = None, limit: int = MAX_TEXT) -> Shape:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, str):
            raise ShapeError(where, f"is {type(value).__name__}, not a string")
        if len(value) > limit or (pattern is not None and not pattern.fullmatch(value)):
            raise ShapeError(where, f"is not a valid value ('{shown(value, limit=80)}')")
    return check


def integer(low: int, high: int) -> Shape:
    def check(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ShapeError(where, f"is {type(value).__name__}, not an integer")
        if not low <= value <= high:
            raise ShapeError(where, f"is {value}, outside {low}..{high}")
    return check


def optional(inner: Shape) -> Shape:
    def check(value: Any, where: str) -> None:
        if value is not None:
            inner(value, where)
    return check


def array(item: Shape, *, limit: int, minimum: int = 0) -> Shape:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise ShapeError(where, f"is {type(value).__name__}, not a list")
        if not minimum <= len(value) <= limit:
            raise ShapeError(where, f"has {len(value)} entries, not {minimum}..{limit}")
        for index, entry in enumerate(value):
            item(entry, f"{where}[{index}]")
    return check


def mapping(values: Shape, *, limit: int = 256) -> Shape:
    """An object of arbitrary string keys, each value checked."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise ShapeError(where, f"is {type(value).__name__}, not an object")
        if len(value) > limit:
            raise ShapeError(where, f"has {len(value)} keys, more than {limit}")
        for key, entry in value.items():
            text(limit=256)(key, f"{where} key")
            values(entry, f"{where}.{shown(key, limit=40)}")
    return check


def obj(fields: Mapping[str, Shape], *, optional_keys: tuple[str, ...] = ()) -> Shape:
    """An object holding ``fields`` (all but ``optional_keys`` required), each of its shape."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise ShapeError(where, f"is {type(value).__name__}, not an object")
        for key, field_shape in fields.items():
            if key not in value:
                if key in optional_keys:
                    continue
                raise ShapeError(where, f"{key!r} is missing")
            field_shape(value[key], f"{where}.{key}" if where else key)
    return check


def boolean(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise ShapeError(where, f"is {type(value).__name__}, not true or false")


def one_of(*choices: str) -> Shape:
    def check(value: Any, where: str) -> None:
        text()(value, where)
        if value not in choices:
            found = shown(value, limit=40)
            raise ShapeError(where, f"{found!r} is not one of {', '.join(choices)}")
    return check


def numeric(low: float, high: float) -> Shape:
    def check(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ShapeError(where, f"is {type(value).__name__}, not a number")
        if not low <= value <= high:
            raise ShapeError(where, f"is {value}, outside {low}..{high}")
    return check


def scalar(value: Any, where: str) -> None:
    """A string, number, boolean or null (what a version or metric value may be)."""
    if isinstance(value, str):
        text()(value, where)
    elif not (value is None or isinstance(value, bool)):
        numeric(-1e300, 1e300)(value, where)


def anything(value: Any, where: str) -> None:
    """Any JSON value (its depth and number sizes were bounded when it was parsed)."""


def any_of(*shapes: Shape) -> Shape:
    def check(value: Any, where: str) -> None:
        problems = []
        for shape in shapes:
            try:
                shape(value, where)
            except ShapeError as exc:
                problems.append(exc.what)
            else:
                return
        raise ShapeError(where, problems[0])
    return check
