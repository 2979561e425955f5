"""The manifest's schema, checked after its signature and before any field is used.

Only the fields stackpin reads are constrained, each to the exact type and range the
export writes; unknown extra keys are allowed (a newer minor writer may add some), but
every key read is present with its type. A value of the wrong shape is one BundleError
(exit 7), never a KeyError or TypeError further in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from stackpin.bundle.format import FORMAT, FORMAT_VERSION, IMAGES, SUMS, UNSIGNED, safe_relative
from stackpin.errors import BundleError
from stackpin.untrusted import shown

MAX_FILES = 100_000
MAX_IMAGES = 256
MAX_FILE_BYTES = 1 << 50  # 1 PiB: larger is a lie, and Python ints would not notice
MAX_TEXT = 4096

Check = Callable[[Any, str], None]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_PROFILE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,127}$")
_TAG = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,200}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")


def _bad(*, where: str, what: str) -> BundleError:
    return BundleError(f"manifest.json: {where} {what}; the bundle is damaged or was not "
                       "written by stackpin: get a fresh copy from the build host")


def text(*, pattern: re.Pattern[str] | None = None, limit: int = MAX_TEXT) -> Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, str):
            raise _bad(where=where, what=f"is {type(value).__name__}, not a string")
        if len(value) > limit or (pattern is not None and not pattern.fullmatch(value)):
            raise _bad(where=where, what=f"is not a valid value ({shown(value, limit=80)!r})")
    return check


def integer(low: int, high: int) -> Check:
    def check(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(where=where, what=f"is {type(value).__name__}, not an integer")
        if not low <= value <= high:
            raise _bad(where=where, what=f"is {value}, outside {low}..{high}")
    return check


def optional(inner: Check) -> Check:
    def check(value: Any, where: str) -> None:
        if value is not None:
            inner(value, where)
    return check


def array(item: Check, *, limit: int, minimum: int = 0) -> Check:
    def check(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise _bad(where=where, what=f"is {type(value).__name__}, not a list")
        if not minimum <= len(value) <= limit:
            raise _bad(where=where, what=f"has {len(value)} entries, not {minimum}..{limit}")
        for index, entry in enumerate(value):
            item(entry, f"{where}[{index}]")
    return check


def mapping(values: Check, *, limit: int = 256) -> Check:
    """An object of arbitrary string keys, each value checked."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _bad(where=where, what=f"is {type(value).__name__}, not an object")
        if len(value) > limit:
            raise _bad(where=where, what=f"has {len(value)} keys, more than {limit}")
        for key, entry in value.items():
            text(limit=256)(key, f"{where} key")
            values(entry, f"{where}.{shown(key, limit=40)}")
    return check


def obj(fields: Mapping[str, Check]) -> Check:
    """An object holding at least ``fields``, each of its type."""
    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise _bad(where=where, what=f"is {type(value).__name__}, not an object")
        for key, field_check in fields.items():
            if key not in value:
                raise _bad(where=where, what=f"lacks {key!r}")
            field_check(value[key], f"{where}.{key}" if where else key)
    return check


def _any_scalar_or_list(value: Any, where: str) -> None:
    if isinstance(value, list):
        array(text(), limit=256)(value, where)
    elif not (value is None or isinstance(value, (str, bool))):
        integer(-(1 << 53), 1 << 53)(value, where)


HEX64 = text(pattern=_HEX64)
FILE_ENTRY = obj({
    "path": text(limit=1024),
    "size": integer(0, MAX_FILE_BYTES),
    "sha256": HEX64,
})
IMAGE = obj({
    "cell": text(pattern=_NAME),
    "variant": text(pattern=_NAME),
    "profile": text(pattern=_PROFILE),
    "id": text(pattern=_IMAGE_ID),
    "tags": array(text(pattern=_TAG), limit=16, minimum=1),
    "port": integer(1, 65535),
    "platform": text(pattern=_NAME),
    "cpu_arch": text(pattern=_NAME),
    "arch": array(text(pattern=_NAME), limit=64),
    "labels": mapping(text()),
    "run": mapping(_any_scalar_or_list, limit=32),
    "size": integer(0, MAX_FILE_BYTES),
})
MANIFEST_SCHEMA = obj({
    "format": text(limit=64),
    "format_version": integer(0, 1 << 31),
    "created": text(limit=64),
    "signed_by": optional(text(limit=128)),
    "images_archive": obj({"tar_bytes": integer(0, MAX_FILE_BYTES)}),
    "images": array(IMAGE, limit=MAX_IMAGES, minimum=1),
    "files": array(FILE_ENTRY, limit=MAX_FILES, minimum=2),
    "sha256sums": HEX64,
})


def validate(manifest: Any) -> dict[str, Any]:
    """``manifest`` if it has the shape stackpin reads; else one BundleError."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        problem = f"is not a {FORMAT} manifest"
        raise _bad(where="the document", what=problem)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        msg = (f"bundle format {shown(version, limit=20)} is not {FORMAT_VERSION}; use the "
               "stackpin version that wrote it")
        raise BundleError(msg)
    MANIFEST_SCHEMA(manifest, "")
    files_problem = _files_problem([str(entry["path"]) for entry in manifest["files"]])
    if files_problem:
        raise _bad(where="files", what=files_problem)
    profiles = [image["profile"] for image in manifest["images"]]
    if len(set(profiles)) != len(profiles):
        problem = "name a profile twice"
        raise _bad(where="images", what=problem)
    return manifest


def _files_problem(paths: list[str]) -> str | None:
    for path in paths:
        if not safe_relative(path) or path in UNSIGNED:
            return f"lists an unsafe path {shown(path)!r}"
    if len(set(paths)) != len(paths):
        return "lists a path twice"
    missing = [needed for needed in (IMAGES, SUMS) if needed not in paths]
    return f"does not list {missing[0]}" if missing else None
