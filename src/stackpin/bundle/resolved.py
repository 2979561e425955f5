"""What a bundle is made of, resolved once: the export's one value (``Resolved``).

Each image is bundled only when it is the one its lock and its build record name: the
record and the Dockerfile kept beside it travel with the image from here on, so nothing
later re-renders or re-reads them. Reports travel only when they were made in this very
image. The stages after this (stream, contents, the writer) take this value, never the
request.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stackpin.build import BuildRecord, built_dockerfile
from stackpin.bundle.delta import Inventory
from stackpin.bundle.format import (
    BundleImage,
    ExportRequest,
    Selection,
    assign_profiles,
    created_epoch,
    run_flags_json,
)
from stackpin.bundle.secrets import scan_image_config
from stackpin.engine import Engine
from stackpin.errors import BundleError, ValidationError
from stackpin.matrix import Variant
from stackpin.render import service_info
from stackpin.signing import Signer
from stackpin.target import LABEL_LOCK_DIGEST, LABEL_REHEARSAL, Layout, Target
from stackpin.verification import verified_image


@dataclass(frozen=True, kw_only=True)
class BuiltImage:
    """A bundled image with what made it: its selection, build record and Dockerfile."""

    selection: Selection
    image: BundleImage
    record: BuildRecord
    dockerfile: str
    reports: Path | None  # the report folder about this very image and lock, if any


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """Everything an export writes from: the images with what made them, the project's
    layout, the bundle's one timestamp and the options that change its contents."""

    built: tuple[BuiltImage, ...]
    layout: Layout
    epoch: int  # the newest SOURCE_DATE_EPOCH of the cells: every time in the bundle
    with_wheels: bool
    with_models: bool
    signer: Signer | None
    threads: int  # zstd workers; the bytes do not depend on them
    archive: Path | None  # also pack the finished folder into this tar
    top: str  # the bundle folder's name (the archive's top directory)
    against: Inventory | None = None  # a delta: leave out the layers this site holds
    frame_cache: Path | None = None  # layer frames kept between exports

    @property
    def selections(self) -> tuple[Selection, ...]:
        return tuple(item.selection for item in self.built)

    @property
    def signed_by(self) -> str | None:
        return self.signer.fingerprint if self.signer else None


def resolve(engine: Engine, request: ExportRequest, *, archive: Path | None) -> Resolved:
    """The request resolved: every image found and checked (see resolve_images)."""
    layout = Layout(request.root)
    return Resolved(
        built=tuple(resolve_images(engine, request.selections, layout,
                                   allow_rehearsal=request.allow_rehearsal)),
        layout=layout,
        epoch=created_epoch(s.cell for s in request.selections),
        with_wheels=request.with_wheels, with_models=request.with_models,
        signer=request.signer, threads=request.zstd_threads, archive=archive,
        top=request.out_dir.name, against=request.against, frame_cache=request.frame_cache,
    )


def resolve_images(
    engine: Engine, selections: Sequence[Selection], layout: Layout, *,
    allow_rehearsal: Collection[str] = frozenset(),
) -> list[BuiltImage]:
    """The built image of every selection, checked against its lock and its build record
    (which must have made this very image); secrets refused, and vendor rehearsal images
    unless their cell is in ``allow_rehearsal``."""
    targets = [Target(cell=s.cell, variant=s.variant, lock=s.lock, layout=layout)
               for s in selections]
    declared: dict[tuple[str, Variant], int] = {
        (t.cell.id, t.variant): t.cell.service.endpoint(t.variant).port
        for t in targets if t.cell.service is not None
    }
    profiles = assign_profiles([(t.cell.id, t.variant) for t in targets], declared)
    return [
        _resolve(engine, selection, target, profile=profile, port=port,
                 allow_rehearsal=allow_rehearsal)
        for selection, target, (profile, port) in zip(selections, targets, profiles, strict=True)
    ]


def _resolve(engine: Engine, selection: Selection, target: Target, *, profile: str,
             port: int, allow_rehearsal: Collection[str]) -> BuiltImage:
    """One image, checked; ``selection`` is only carried along (``target`` is what it
    resolved to)."""
    cell, lock, tag = target.cell, target.lock, target.tags[0]
    info = engine.image_info(tag)
    if info is None:
        msg = (
            f"no image {tag} (cell {cell.id}, variant {target.variant}, lock "
            f"{lock.digest[:12]}): build it first with `stackpin build {cell.id} "
            f"--variant {target.variant}`"
        )
        raise BundleError(msg)
    if info.labels.get(LABEL_LOCK_DIGEST) != lock.digest:
        msg = (
            f"{tag} carries lock digest {info.labels.get(LABEL_LOCK_DIGEST)!r}, "
            f"not {lock.digest}: rebuild it with `stackpin build {cell.id}`"
        )
        raise BundleError(msg)
    refuse_rehearsal(info.labels, cell=cell.id, tag=tag, allowed=allow_rehearsal)
    try:
        record, dockerfile = built_dockerfile(target, image_id=info.id, labels=info.labels)
    except ValidationError as exc:
        raise BundleError(exc.message) from None
    scan_image_config(info, name=tag)
    image = BundleImage(
        cell=cell.id, variant=target.variant, profile=profile, port=port,
        platform=cell.platform, cpu_arch=cell.cpu_arch, arch=cell.arch, id=info.id,
        # The moving tag travels only when it still names this very image.
        tags=tuple(t for t in target.tags if t in info.tags or t == tag),
        labels=dict(info.labels), run=run_flags_json(cell.run), size=info.size,
        service=service_info(cell.service, target.variant) if cell.service else None,
    )
    # A report about another build says nothing of this image.
    reports = target.report_dir if verified_image(target) == info.id else None
    return BuiltImage(selection=selection, image=image, record=record, dockerfile=dockerfile,
                      reports=reports)


def refuse_rehearsal(labels: Mapping[str, str], *, cell: str, tag: str,
                     allowed: Collection[str]) -> None:
    """BundleError when the image is a vendor rehearsal (stackpin.rehearsal) and its cell
    was not allowed by name."""
    marked = labels.get(LABEL_REHEARSAL)
    if marked is None or cell in allowed:
        return
    msg = (
        f"{tag} is a vendor rehearsal image ({marked}), not a {cell} image for a site: "
        f"build it from the real vendor files, or pass --allow-rehearsal {cell} to bundle "
        f"the stand-in on purpose"
    )
    raise BundleError(msg)
