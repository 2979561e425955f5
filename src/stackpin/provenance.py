"""Build provenance for stackpin images: an in-toto Statement v1 with a SLSA Provenance v1
predicate (https://slsa.dev/spec/v1.0/provenance). Pure: same arguments, same bytes.

Subjects are the images (their IDs, i.e. config digests, which normalisation makes
reproducible). Resolved dependencies are everything a build reads: the base image, every
locked wheel by sha256, the lock itself, the rendered Dockerfile of each variant and the
stackpin source commit. No timestamps or host names: two exports of the same images
carry the same statement, so a bundle stays byte-identical and the manifest signature
covers it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from stackpin.errors import ValidationError
from stackpin.lock import Lock
from stackpin.normalize import NORMALIZE_VERSION
from stackpin.primitives import canonical_json

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# Documented in docs/reproducibility.md ("Provenance"): what the parameters mean.
BUILD_TYPE = "https://stackpin.dev/provenance/build/classic-normalized/v1"
BUILDER_ID = "https://stackpin.dev/provenance/builder/stackpin-cli"
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_GIT_COMMIT = re.compile(r"^([0-9a-f]{40})(\+dirty)?$")


@dataclass(frozen=True, kw_only=True)
class ImageSubject:
    """One built image: a tag that names it and its image ID."""

    name: str
    image_id: str


@dataclass(frozen=True, kw_only=True)
class ProvenanceInputs:
    """What the images were built from."""

    lock: Lock
    base_reference: str
    base_image_id: str  # the base's image ID (what an air-gapped site pins)
    dockerfiles: Mapping[str, str]  # variant -> rendered Dockerfile text
    stackpin_version: str
    source_commit: str  # 40 hex, optionally "+dirty"; anything else is recorded as is


def _sha256_hex(value: str, what: str) -> str:
    if _IMAGE_ID.match(value):
        return value.removeprefix("sha256:")
    if _HEX64.match(value):
        return value
    msg = f"{what} {value!r} is not a sha256 digest; pass an image ID (sha256:<64 hex>)"
    raise ValidationError(msg)


def _wheel_uri(name: str, version: str, source: str, filename: str) -> str:
    if source == "vendor":
        return f"file:wheels/vendor/{quote(filename)}"
    return f"pkg:pypi/{name}@{quote(version, safe='')}?file_name={quote(filename)}"


def resolved_dependencies(inputs: ProvenanceInputs) -> list[dict[str, Any]]:
    """Every input of the build as SLSA ResourceDescriptors, in a fixed order."""
    lock = inputs.lock
    deps: list[dict[str, Any]] = [
        {
            "name": "base-image",
            "uri": f"docker-image:{inputs.base_reference}",
            "digest": {"sha256": _sha256_hex(inputs.base_image_id, "base image ID")},
        },
        {
            "name": f"pinning/locks/{lock.cell}.lock",
            "digest": {"sha256": _sha256_hex(lock.digest, "lock digest")},
        },
    ]
    for variant, text in sorted(inputs.dockerfiles.items()):
        deps.append({
            "name": f"Dockerfile ({variant})",
            "digest": {"sha256": hashlib.sha256(text.encode()).hexdigest()},
            "annotations": {"variant": variant},
        })
    for wheel in sorted(lock.wheels, key=lambda w: (w.group, w.filename)):
        deps.append({
            "name": wheel.filename,
            "uri": _wheel_uri(wheel.name, wheel.version, wheel.source, wheel.filename),
            "digest": {"sha256": _sha256_hex(wheel.sha256, f"sha256 of {wheel.filename}")},
            "annotations": {"group": wheel.group, "source": wheel.source},
        })
    match = _GIT_COMMIT.match(inputs.source_commit)
    source: dict[str, Any] = {"name": "stackpin-source"}
    if match:
        source["digest"] = {"gitCommit": match.group(1)}
        source["annotations"] = {"dirty": bool(match.group(2))}
    else:
        source["annotations"] = {"commit": inputs.source_commit}
    deps.append(source)
    return deps


def provenance_statement(
    inputs: ProvenanceInputs, subjects: Sequence[ImageSubject]
) -> dict[str, Any]:
    """The in-toto Statement (a JSON-ready dict) for images built from ``inputs``."""
    if not subjects:
        msg = "a provenance statement needs at least one image; build the cell first"
        raise ValidationError(msg)
    lock = inputs.lock
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": s.name, "digest": {"sha256": _sha256_hex(s.image_id, f"image ID of {s.name}")}}
            for s in sorted(subjects, key=lambda s: (s.name, s.image_id))
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "cell": lock.cell,
                    "variants": sorted(inputs.dockerfiles),
                    "lockDigest": lock.digest,
                },
                "internalParameters": {
                    "cellDigest": lock.cell_digest,
                    "python": lock.python,
                    "sourceDateEpoch": lock.source_date_epoch,
                    "network": "none",
                    "normalizeVersion": NORMALIZE_VERSION,
                },
                "resolvedDependencies": resolved_dependencies(inputs),
            },
            "runDetails": {
                "builder": {
                    "id": BUILDER_ID,
                    "version": {"stackpin": inputs.stackpin_version},
                },
                # No invocation ID or start/finish times: the statement must be the same
                # for every export of the same images.
                "metadata": {},
            },
        },
    }


def statement_bytes(statement: Mapping[str, Any]) -> bytes:
    """Canonical JSON (sorted keys, no spaces, UTF-8, trailing newline) for files and signing."""
    return (canonical_json(statement) + "\n").encode()
