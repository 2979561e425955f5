"""The manifest's schema, checked after its signature and before any field is used.

Only the fields stackpin reads are constrained, each to the exact type and range the
export writes; unknown extra keys are allowed (a newer minor writer may add some), but
every key read is present with its type. A value of the wrong shape is one BundleError
(exit 7), never a KeyError or TypeError further in.
"""

from __future__ import annotations

import re
from typing import Any

from stackpin.bundle.format import FORMAT, FORMAT_VERSION, IMAGES, SUMS, UNSIGNED, safe_relative
from stackpin.errors import BundleError
from stackpin.shapes import array, conform, integer, mapping, obj, optional, scalar, text
from stackpin.untrusted import shown

MAX_FILES = 100_000
MAX_IMAGES = 256
MAX_FILE_BYTES = 1 << 50  # 1 PiB: larger is a lie, and Python ints would not notice

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_PROFILE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,127}$")
_TAG = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,200}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")


def _bad(problem: str) -> BundleError:
    return BundleError(f"manifest.json: {problem}; the bundle is damaged or was not "
                       "written by stackpin: get a fresh copy from the build host")


def _run_value(value: Any, where: str) -> None:
    if isinstance(value, list):
        array(text(), limit=256)(value, where)
    else:
        scalar(value, where)


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
    "run": mapping(_run_value, limit=32),
    "size": integer(0, MAX_FILE_BYTES),
    # Delta bundles only: the layers left out, which the site must hold.
    "base_layers": array(obj({"chain_id": text(pattern=_IMAGE_ID),
                              "diff_id": text(pattern=_IMAGE_ID)}), limit=4096),
}, optional_keys=("base_layers",))
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
        problem = f"the document is not a {FORMAT} manifest"
        raise _bad(problem)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        msg = (f"bundle format {shown(version, limit=20)} is not {FORMAT_VERSION}; use the "
               "stackpin version that wrote it")
        raise BundleError(msg)
    conform(MANIFEST_SCHEMA, manifest, _bad)
    files_problem = _files_problem([str(entry["path"]) for entry in manifest["files"]])
    if files_problem:
        problem = f"files {files_problem}"
        raise _bad(problem)
    profiles = [image["profile"] for image in manifest["images"]]
    if len(set(profiles)) != len(profiles):
        problem = "images name a profile twice"
        raise _bad(problem)
    return manifest


def _files_problem(paths: list[str]) -> str | None:
    for path in paths:
        if not safe_relative(path) or path in UNSIGNED:
            return f"lists an unsafe path {shown(path)!r}"
    if len(set(paths)) != len(paths):
        return "lists a path twice"
    missing = [needed for needed in (IMAGES, SUMS) if needed not in paths]
    return f"does not list {missing[0]}" if missing else None
