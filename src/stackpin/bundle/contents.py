"""What a bundle holds besides its image streams, planned as data.

Each file is an Entry (bundle.format): its path in the bundle and either its bytes or the
file it is copied from. Planning reads the project (skeleton, wheelhouse, models, reports) and the
resolved images, and writes nothing; the export's one writer puts the entries in place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from stackpin import __version__, provenance, sbom
from stackpin.bundle import models
from stackpin.bundle.format import BundleImage, Entry, StreamStats
from stackpin.bundle.resolved import BuiltImage, Resolved
from stackpin.bundle.siteconf import bundle_conf, profile_conf
from stackpin.bundle.source import rebuild_files
from stackpin.context import read_sources
from stackpin.engine import Engine
from stackpin.errors import BundleError, ValidationError
from stackpin.lock import Lock
from stackpin.matrix import cell_to_dict
from stackpin.primitives import pretty_json, rfc3339
from stackpin.render import render_template
from stackpin.target import LABEL_SOURCE_COMMIT, LABEL_VERSION, Layout


def plan(resolved: Resolved, images: Sequence[BundleImage], stream: StreamStats, *,
         sboms: Sequence[Entry]) -> list[Entry]:
    """Every file but the image streams, SHA256SUMS and the manifest; ``sboms`` are the
    SBOM files (``sbom_entries``, made beside the save)."""
    built, root = resolved.built, resolved.layout.root
    created = rfc3339(resolved.epoch)
    entries = [*sboms, *provenance_files(built, stackpin_version=__version__)]
    if resolved.with_wheels:
        entries += rebuild_files(resolved.layout, built)
    entries += site_files(root / "bundle", images, stream)
    entries += build_files(built, root=root, with_wheels=resolved.with_wheels)
    entries += model_files(root, ship=resolved.with_models, created=created)
    entries += report_files(built)
    return [*entries, readme_file(resolved, images)]


def readme_file(resolved: Resolved, images: Sequence[BundleImage]) -> Entry:
    """README.md: what the bundle holds and how a site loads it."""
    text = render_template(read_sources(resolved.layout.root / "bundle"), "README.md.j2", {
        "created": rfc3339(resolved.epoch),
        "images": [i.to_json() for i in images],
        "signed_by": resolved.signed_by,
        "stackpin_version": __version__,
        "layout_version": layout_version(resolved.layout),
        "with_wheels": resolved.with_wheels,
    })
    return Entry(path="README.md", data=text.encode())


def layout_version(layout: Layout) -> str:
    """The version of the site scripts' layout (bundle/LAYOUT_VERSION)."""
    return (layout.root / "bundle" / "LAYOUT_VERSION").read_text(encoding="utf-8").strip()


def site_files(skeleton: Path, images: Sequence[BundleImage], stream: StreamStats) -> \
        list[Entry]:
    """The site scripts and the data they source."""
    entries = [Entry(path=f"bin/{s.name}", source=s) for s in sorted(skeleton.glob("bin/*.sh"))]
    entries.append(Entry(path="bin/bundle.conf", data=bundle_conf(images, stream).encode()))
    entries += [Entry(path=f"bin/profiles/{i.profile}.conf", data=profile_conf(i).encode())
                for i in images]
    return entries


def build_files(built: Sequence[BuiltImage], *, root: Path, with_wheels: bool) -> list[Entry]:
    """Per image: the Dockerfile that built it (never a render from today's templates),
    its cell's lock and cell JSON, and with ``with_wheels`` the locked wheels."""
    entries = []
    for item in built:
        cell, lock = item.selection.cell, item.selection.lock
        entries += [
            Entry(path=f"dockerfiles/{item.image.name}.Dockerfile",
                  data=item.dockerfile.encode()),
            Entry(path=f"locks/{cell.id}.lock", data=lock.text().encode()),
            Entry(path=f"locks/{cell.id}.cell.json", data=pretty_json(cell_to_dict(cell)).encode()),
        ]
        if with_wheels:
            entries += _wheel_files(root, lock)
    return entries


def _wheel_files(root: Path, lock: Lock) -> Iterator[Entry]:
    from stackpin.wheelhouse import locate

    for wheel in lock.wheels:
        yield Entry(path=f"wheels/{lock.cell}/{wheel.filename}",
                    source=locate(root, lock.cell, wheel.filename), sha256=wheel.sha256)


def report_files(built: Sequence[BuiltImage]) -> list[Entry]:
    """The reports made in the bundled images (see images.BuiltImage.reports)."""
    return [
        Entry(path=f"reports/{item.reports.name}/{found.relative_to(item.reports).as_posix()}",
              source=found)
        for item in built if item.reports is not None
        for found in sorted(item.reports.rglob("*"))
        if found.is_file() and not found.is_symlink()
    ]


def model_files(root: Path, *, ship: bool, created: str) -> list[Entry]:
    """models/README.md; with ``ship``, the model folders as found, their licence texts
    under licenses/ and sbom/models.cdx.json."""
    entries = [Entry(path=f"{models.FOLDER}/README.md", data=models.README.encode())]
    if not ship:
        return entries
    records = []
    for model in models.find_models(root / models.FOLDER):
        folder = root / models.FOLDER / model.name
        entries += [Entry(path=f"{models.FOLDER}/{model.name}/{f.rel}", source=folder / f.rel)
                    for f in model.files]
        entries += [Entry(path=f"licenses/models/{model.name}/{rel}", source=folder / rel)
                    for rel in model.licence_files]
        records.append(sbom.ModelRecord(
            name=model.name, licence=model.licence,
            files=tuple((f"{models.FOLDER}/{model.name}/{f.rel}", f.sha256)
                        for f in model.files)))
    document = sbom.sbom_bytes(sbom.models_document(
        records, created=created, serial_key=json.dumps([r.files for r in records])))
    return [*entries, Entry(path="sbom/models.cdx.json", data=document)]


def probe_inventories(engine: Engine, built: Sequence[BuiltImage]) -> dict[
        str, sbom.Inventory]:
    """Each image's own package inventory by image ID: the one its build recorded (the
    probe ran in the build's measuring container), else from the probe run inside it now.

    Export runs this beside the save stream (it needs only the images' IDs): a probe's
    container start and its Python were 8-12 s an image, and even beside the save they
    took CPU from it on a loaded host; a recorded inventory costs no container at all.
    """
    inventories = {}
    for item in built:
        image = item.image
        if item.record.inventory:
            inventories[image.id] = sbom.parse_probe(item.record.inventory, image=image.tags[0])
            continue
        result = engine.run_to_completion(sbom.probe_request(image.id), timeout_s=600)
        if result.exit_code != 0:
            msg = (
                f"cannot list the packages of {image.tags[0]} (exit {result.exit_code}): "
                f"{result.logs.strip()[-200:]}; run it by hand to see why"
            )
            raise BundleError(msg)
        inventories[image.id] = sbom.parse_probe(result.stdout, image=image.tags[0])
    return inventories


def sbom_entries(engine: Engine, resolved: Resolved) -> list[Entry]:
    """The SBOM files of every bundled image: needs only the images' IDs and tags, so the
    export makes them (inventories, CycloneDX documents, their schema check) beside the save."""
    return sbom_files(probe_inventories(engine, resolved.built),
                      [item.image for item in resolved.built], rfc3339(resolved.epoch))


def sbom_files(inventories: Mapping[str, sbom.Inventory], images: Sequence[BundleImage],
               created: str) -> list[Entry]:
    """sbom/<image>.cdx.json from each image's own package inventory, and the licence
    texts its files carry."""
    entries = []
    for image in images:
        inventory = inventories[image.id]
        subject = sbom.Subject(image_id=image.id, tag=image.tags[0], created=created)
        document = sbom.sbom_bytes(sbom.cyclonedx(inventory, subject))
        problem = sbom.schema_errors(document)
        if problem is not None:  # a library or probe regression: never ship an invalid SBOM
            msg = f"the SBOM of {image.tags[0]} is not valid CycloneDX: {problem[:300]}"
            raise BundleError(msg)
        entries.append(Entry(path=f"sbom/{image.name}.cdx.json", data=document))
        entries += [Entry(path=n.bundle_path, data=n.text.encode()) for n in inventory.notices]
    return entries


def provenance_files(built: Sequence[BuiltImage], *, stackpin_version: str) -> list[Entry]:
    """provenance/<cell>.intoto.json: an in-toto / SLSA v1 statement per cell, from the
    build records (listed in the manifest like every file, so its signature covers it)."""
    entries = []
    for cell_id in dict.fromkeys(item.image.cell for item in built):
        of_cell = [item for item in built if item.image.cell == cell_id]
        first = of_cell[0]
        labels = first.image.labels
        inputs = provenance.ProvenanceInputs(
            lock=first.selection.lock,
            base_reference=first.record.base_reference,
            base_image_id=first.record.base_id,
            dockerfiles={item.image.variant: item.dockerfile for item in of_cell},
            stackpin_version=labels.get(LABEL_VERSION, stackpin_version),
            source_commit=labels.get(LABEL_SOURCE_COMMIT, "unknown"),
        )
        subjects = [provenance.ImageSubject(name=i.image.tags[0], image_id=i.image.id)
                    for i in of_cell]
        try:
            statement = provenance.provenance_statement(inputs, subjects)
        except ValidationError as exc:
            msg = f"cannot state the provenance of {cell_id}: {exc.message}"
            raise BundleError(msg) from None
        entries.append(Entry(path=f"provenance/{cell_id}.intoto.json",
                             data=provenance.statement_bytes(statement)))
    return entries
