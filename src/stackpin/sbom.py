"""CycloneDX 1.6 SBOMs read from the image itself, written through cyclonedx-python-lib.

A container runs a small probe with the image's own interpreter: ``dpkg-query`` for the
Debian/Ubuntu packages and ``importlib.metadata`` for the Python distributions of the
environment, with each distribution's declared licence and the third-party notice files
the bundle must carry (Studio's AGPL-3.0 text). The lock says what *should* be installed;
the SBOM says what *is*. The document is a pure function of the probe's output and the
image, so two exports of the same image give the same bytes (issue 7): no wall clock, a
serial number derived from the image ID, components sorted by the library.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from cyclonedx.contrib.license.factories import LicenseFactory
from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import DisjunctiveLicense, License, LicenseExpression
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL

from stackpin import __version__
from stackpin.engine import RunRequest
from stackpin.errors import BundleError

PYTHON = "/opt/stackpin/venv/bin/python"
SCHEMA = SchemaVersion.V1_6


@dataclass(frozen=True, kw_only=True)
class NoticeSource:
    """A licence file inside a distribution that covers part of it under another licence."""

    dist: str  # the distribution that installs the file
    path: str  # relative to the distribution's install root
    component: str  # the SBOM component the notice belongs to
    licence: str  # SPDX expression, cited from the source files' SPDX headers


# unsloth's COPYING: "Files under studio/*, unsloth_cli/* ... are AGPLv3 licensed"; the
# studio sources carry "SPDX-License-Identifier: AGPL-3.0-only".
NOTICES = (
    NoticeSource(dist="unsloth", path="studio/LICENSE.AGPL-3.0", component="unsloth-studio",
                 licence="AGPL-3.0-only"),
)

# Runs inside the image with its venv's python; prints one JSON document on stdout.
PROBE = r"""
import importlib.metadata as md, json, subprocess, sys
WANTED = __WANTED__
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
def licence(meta):
    expression = meta.get("License-Expression") or ""
    if expression:
        return ["expression", expression]
    text = (meta.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 80:
        return ["name", text]
    for classifier in meta.get_all("Classifier") or []:
        if classifier.startswith("License :: ") and classifier.count("::") >= 2:
            return ["name", classifier.rsplit("::", 1)[1].strip()]
    return ["", ""]
dists, notices = {}, []
for d in md.distributions():
    name = d.metadata["Name"]
    if not name:
        continue
    dists[(name, d.version)] = licence(d.metadata)
    for dist, path in WANTED:
        if name.lower() == dist:
            try:
                text = d.locate_file(path).read_text(encoding="utf-8")
            except OSError:
                continue
            notices.append([dist, path, text])
print(json.dumps({"os": {"id": os_release.get("ID", ""),
                         "version_id": os_release.get("VERSION_ID", "")},
                  "python": sys.version.split()[0],
                  "debs": sorted(debs),
                  "dists": sorted([n, v, *lic] for (n, v), lic in dists.items()),
                  "notices": sorted(notices)}))
""".replace("__WANTED__", repr([[n.dist, n.path] for n in NOTICES]))
# A fixed namespace: the serial number is uuid5(namespace, image id).
_SERIAL_NAMESPACE = uuid.UUID("6f1d2a4e-5b0c-4f5e-9a7d-2c3b4e5f6a70")


@dataclass(frozen=True, kw_only=True)
class Dist:
    """A Python distribution with the licence its metadata declares."""

    name: str
    version: str
    licence_kind: str = ""  # "expression" (SPDX, License-Expression), "name" or ""
    licence: str = ""


@dataclass(frozen=True, kw_only=True)
class Notice:
    """A notice file found in the image: ``source`` says what it covers."""

    source: NoticeSource
    text: str

    @property
    def bundle_path(self) -> str:
        """Where the bundle carries it."""
        return f"licenses/{self.source.component}/{self.source.path.rsplit('/', 1)[-1]}"


@dataclass(frozen=True, kw_only=True)
class Inventory:
    os_id: str
    os_version: str
    python: str
    debs: tuple[tuple[str, str, str], ...]  # name, version, architecture
    dists: tuple[Dist, ...]
    notices: tuple[Notice, ...] = ()


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


def _notice(dist: str, path: str, text: str) -> Notice:
    source = next(n for n in NOTICES if (n.dist, n.path) == (dist, path))
    return Notice(source=source, text=text)


def parse_probe(stdout: str, *, image: str) -> Inventory:
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        return Inventory(
            os_id=str(data["os"]["id"]),
            os_version=str(data["os"]["version_id"]),
            python=str(data["python"]),
            debs=tuple(sorted((str(n), str(v), str(a)) for n, v, a in data["debs"])),
            dists=tuple(sorted(
                (Dist(name=str(n), version=str(v), licence_kind=str(k), licence=str(lic))
                 for n, v, k, lic in data["dists"]),
                key=lambda d: (d.name, d.version),
            )),
            notices=tuple(_notice(str(d), str(p), str(t)) for d, p, t in data["notices"]),
        )
    except (IndexError, KeyError, TypeError, ValueError, StopIteration) as exc:
        msg = (
            f"cannot read the package inventory of {image} ({exc!r}): the image lacks "
            f"{PYTHON}; export only images built by `stackpin build`"
        )
        raise BundleError(msg) from None


def licences(kind: str, value: str) -> list[License]:
    """A declared licence as CycloneDX: SPDX ids and expressions kept, other text as a name."""
    if not value:
        return []
    if kind == "expression":
        return [LicenseFactory().make_from_string(value)]
    return [DisjunctiveLicense(name=value)]


def _source(kind: str) -> Property:
    return Property(name="io.stackpin:source", value=kind)


def _deb(os_id: str, name: str, version: str, arch: str) -> Component:
    purl = PackageURL(type="deb", namespace=os_id or "debian", name=name, version=version,
                      qualifiers={"arch": arch})
    return Component(name=name, version=version, purl=purl, bom_ref=purl.to_string(),
                     properties=[_source("dpkg")])


def _pypi(dist: Dist) -> Component:
    normal = dist.name.lower().replace("_", "-").replace(".", "-")
    purl = PackageURL(type="pypi", name=normal, version=dist.version)
    return Component(name=dist.name, version=dist.version, purl=purl,
                     bom_ref=purl.to_string(), properties=[_source("python")],
                     licenses=licences(dist.licence_kind, dist.licence))


def _covered(notice: Notice, dists: Iterable[Dist]) -> Component:
    """The part of a distribution that its notice licenses differently (Studio in unsloth)."""
    version = next((d.version for d in dists if d.name.lower() == notice.source.dist), "")
    directory = notice.source.path.rsplit("/", 1)[0]
    purl = PackageURL(type="pypi", name=notice.source.dist, version=version or None,
                      subpath=directory)
    return Component(
        name=notice.source.component, version=version, purl=purl, bom_ref=purl.to_string(),
        type=ComponentType.APPLICATION, licenses=[LicenseExpression(notice.source.licence)],
        properties=[_source("python"),
                    Property(name="io.stackpin:notice", value=notice.bundle_path)],
    )


def cyclonedx(inventory: Inventory, subject: Subject) -> Bom:
    """The CycloneDX document of one image (pure)."""
    repo, _, tag = subject.tag.rpartition(":")
    os_name = f"{inventory.os_id} {inventory.os_version}".strip()
    root = Component(
        bom_ref=subject.image_id, type=ComponentType.CONTAINER, name=repo or subject.tag,
        version=tag,
        hashes=[HashType(alg=HashAlgorithm.SHA_256,
                         content=subject.image_id.removeprefix("sha256:"))],
        properties=[Property(name="io.stackpin:os", value=os_name),
                    Property(name="io.stackpin:python", value=inventory.python)],
    )
    components = [_deb(inventory.os_id, *deb) for deb in inventory.debs]
    components += [_pypi(d) for d in inventory.dists]
    components += [_covered(n, inventory.dists) for n in inventory.notices]
    return _document(root, components, serial_key=subject.image_id, created=subject.created)


def _document(root: Component, components: list[Component], *, serial_key: str,
              created: str) -> Bom:
    metadata = BomMetaData(
        component=root, timestamp=datetime.fromisoformat(created.replace("Z", "+00:00")),
    )
    metadata.tools.components.add(
        Component(type=ComponentType.APPLICATION, name="stackpin", version=__version__)
    )
    bom = Bom(metadata=metadata, components=components,
              serial_number=uuid.uuid5(_SERIAL_NAMESPACE, serial_key))
    bom.register_dependency(root, components)
    return bom


def sbom_bytes(bom: Bom) -> bytes:
    """The JSON as the library writes it, keys sorted so equal documents are equal bytes."""
    text = JsonV1Dot6(bom).output_as_string()
    return (json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n").encode()


def schema_errors(data: bytes) -> str | None:
    """What makes ``data`` invalid against the CycloneDX 1.6 JSON schema (None: valid)."""
    # Imported here, not at the top: the validator's jsonschema format checkers build a
    # grammar at import (about 1.5 s of CPU), which every stackpin command would pay,
    # `bundle load` included, though only export and verify validate a document.
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SCHEMA).validate_str(data.decode())
    return None if error is None else str(error)


@dataclass(frozen=True, kw_only=True)
class ModelRecord:
    """A model folder a bundle ships: its licence and the hashes of its files."""

    name: str
    licence: str
    files: tuple[tuple[str, str], ...]  # (bundle path, sha256)


def models_document(models: Iterable[ModelRecord], *, created: str, serial_key: str) -> Bom:
    """The CycloneDX document of a bundle's ``models/`` folder (pure)."""
    root = Component(bom_ref="models", type=ComponentType.DATA, name="models",
                     description="model folders shipped in the bundle's models/")
    components = [
        Component(
            bom_ref=f"models/{m.name}", type=ComponentType.MACHINE_LEARNING_MODEL, name=m.name,
            licenses=[LicenseFactory().make_from_string(m.licence)],
            components=[
                Component(bom_ref=path, type=ComponentType.FILE, name=path,
                          hashes=[HashType(alg=HashAlgorithm.SHA_256, content=digest)])
                for path, digest in m.files
            ],
        )
        for m in models
    ]
    return _document(root, components, serial_key=serial_key, created=created)
