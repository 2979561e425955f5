"""CycloneDX 1.5 SBOMs read from the image itself, not from the lock.

A container runs a small probe with the image's own interpreter: ``dpkg-query`` for the
Debian/Ubuntu packages and ``importlib.metadata`` for the Python distributions of the
environment. The lock says what *should* be installed; the SBOM says what *is*. The
document is a pure function of the probe's output and the image, so two exports of the
same image give the same bytes (issue 7): no wall clock, a serial number derived from the
image ID, components sorted by purl.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from stackpin import __version__
from stackpin.engine import RunRequest
from stackpin.errors import BundleError

PYTHON = "/opt/stackpin/venv/bin/python"
# Runs inside the image with its venv's python; prints one JSON document on stdout.
PROBE = r"""
import importlib.metadata as md, json, subprocess, sys
os_release = {}
try:
    for line in open("/etc/os-release", encoding="utf-8"):
        key, sep, value = line.strip().partition("=")
        if sep:
            os_release[key] = value.strip('"')
except OSError:
    pass
debs = []
try:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${Architecture}\n"],
        check=True, capture_output=True, text=True).stdout
    debs = [line.split("\t") for line in out.splitlines() if line.count("\t") == 2]
except (OSError, subprocess.CalledProcessError):
    pass
dists = sorted({(d.metadata["Name"], d.version) for d in md.distributions()
                if d.metadata["Name"]})
print(json.dumps({"os": {"id": os_release.get("ID", ""),
                         "version_id": os_release.get("VERSION_ID", "")},
                  "python": sys.version.split()[0],
                  "debs": sorted(debs), "dists": [list(d) for d in dists]}))
"""
# A fixed namespace: the serial number is uuid5(namespace, image id).
_SERIAL_NAMESPACE = uuid.UUID("6f1d2a4e-5b0c-4f5e-9a7d-2c3b4e5f6a70")


@dataclass(frozen=True, kw_only=True)
class Inventory:
    os_id: str
    os_version: str
    python: str
    debs: tuple[tuple[str, str, str], ...]  # name, version, architecture
    dists: tuple[tuple[str, str], ...]  # name, version


@dataclass(frozen=True, kw_only=True)
class Subject:
    """The image an SBOM describes."""

    image_id: str
    tag: str
    created: str  # RFC 3339, from the cell's SOURCE_DATE_EPOCH


def probe_request(image: str) -> RunRequest:
    return RunRequest(
        image=image, entrypoint=(PYTHON,), command=("-c", PROBE), network_mode="none"
    )


def parse_probe(stdout: str, *, image: str) -> Inventory:
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        return Inventory(
            os_id=str(data["os"]["id"]),
            os_version=str(data["os"]["version_id"]),
            python=str(data["python"]),
            debs=tuple(sorted((str(n), str(v), str(a)) for n, v, a in data["debs"])),
            dists=tuple(sorted((str(n), str(v)) for n, v in data["dists"])),
        )
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        msg = (
            f"cannot read the package inventory of {image} ({exc!r}): the image lacks "
            f"{PYTHON}; export only images built by `stackpin build`"
        )
        raise BundleError(msg) from None


def _deb_purl(os_id: str, name: str, version: str, arch: str) -> str:
    distro = quote(os_id or "debian", safe="")
    return f"pkg:deb/{distro}/{quote(name, safe='')}@{quote(version, safe='')}?arch={arch}"


def _pypi_purl(name: str, version: str) -> str:
    normal = name.lower().replace("_", "-").replace(".", "-")
    return f"pkg:pypi/{quote(normal, safe='')}@{quote(version, safe='')}"


def _component(kind: str, name: str, version: str, purl: str) -> dict[str, Any]:
    return {
        "bom-ref": purl,
        "name": name,
        "properties": [{"name": "io.stackpin:source", "value": kind}],
        "purl": purl,
        "type": "library",
        "version": version,
    }


def cyclonedx(inventory: Inventory, subject: Subject) -> dict[str, Any]:
    """The CycloneDX 1.5 JSON document (pure)."""
    components = [
        _component("dpkg", n, v, _deb_purl(inventory.os_id, n, v, a))
        for n, v, a in inventory.debs
    ] + [_component("python", n, v, _pypi_purl(n, v)) for n, v in inventory.dists]
    components.sort(key=lambda c: (str(c["purl"]), str(c["name"])))
    repo, _, tag = subject.tag.rpartition(":")
    os_name = f"{inventory.os_id} {inventory.os_version}".strip()
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid5(_SERIAL_NAMESPACE, subject.image_id)}",
        "version": 1,
        "metadata": {
            "timestamp": subject.created,
            "tools": {
                "components": [
                    {"type": "application", "name": "stackpin", "version": __version__}
                ]
            },
            "component": {
                "bom-ref": subject.image_id,
                "type": "container",
                "name": repo or subject.tag,
                "version": tag,
                "hashes": [{"alg": "SHA-256", "content": subject.image_id.removeprefix("sha256:")}],
                "properties": [
                    {"name": "io.stackpin:os", "value": os_name},
                    {"name": "io.stackpin:python", "value": inventory.python},
                ],
            },
        },
        "components": components,
    }


def sbom_bytes(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
