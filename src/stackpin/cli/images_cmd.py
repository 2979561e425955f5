"""``stackpin images``: the images stackpin built, with the sizes hygiene is judged by."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import click

from stackpin.build import read_record
from stackpin.cli.common import ENGINE, echo_json, json_option, project_root
from stackpin.engine import ImageInfo
from stackpin.matrix import Variant
from stackpin.target import (
    LABEL_CELL,
    LABEL_LOCK_DIGEST,
    LABEL_VARIANT,
    variant_choices,
)

MIB = 2**20


@dataclass(frozen=True, kw_only=True)
class ImageRow:
    cell: str
    variant: str
    id: str
    tags: list[str]
    lock_digest: str
    size: int
    base_size: int | None
    env_size: int | None

    @property
    def overhead(self) -> float | None:
        if self.base_size is None or self.env_size is None:
            return None
        return round(self.size / (self.base_size + self.env_size), 4)

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "overhead": self.overhead}


def image_row(info: ImageInfo, record: dict[str, object] | None) -> ImageRow:
    """Join what the daemon says with the build record (sizes measured at build time)."""
    measured = record is not None and record.get("image_id") == info.id
    return ImageRow(
        cell=info.labels.get(LABEL_CELL, ""),
        variant=info.labels.get(LABEL_VARIANT, ""),
        id=info.id,
        tags=sorted(info.tags),
        lock_digest=info.labels.get(LABEL_LOCK_DIGEST, ""),
        size=info.size,
        base_size=int(str(record["base_size"])) if measured and record else None,
        env_size=int(str(record["env_size"])) if measured and record else None,
    )


def _record_of(root: Path, info: ImageInfo) -> dict[str, object] | None:
    """The build record of a labelled image; none for a variant label we do not know."""
    label = info.labels.get(LABEL_VARIANT, "")
    if label not in variant_choices(allow_all=False):
        return None
    return read_record(root, info.labels.get(LABEL_CELL, ""), Variant(label))


def built_images(infos: list[ImageInfo]) -> list[ImageInfo]:
    """The images a build produced: untagged ones carrying our labels are the classic
    builder's raw output, kept only as layer cache after normalisation."""
    return [info for info in infos if info.tags]


@click.command(name="images")
@json_option
def command(as_json: bool) -> None:
    """List built images: cell, variant, lock digest, size, base + environment sizes.

    The size is the unpacked size of the image's layers on either store (on the containerd
    image store, not the compressed content that `docker image inspect` reports).
    The environment size is measured at build time (du of /opt/stackpin in the image);
    hygiene holds when size <= 1.05 x (base + environment), i.e. no wheel, cache or
    apt list was left in a layer.
    """
    root = project_root()
    with ENGINE.open() as engine:
        rows = [
            image_row(info, _record_of(root, info))
            for info in built_images(engine.list_images(LABEL_CELL))
        ]
    if as_json:
        echo_json([row.to_json() for row in rows])
        return
    if not rows:
        click.echo("no stackpin images; build one with 'stackpin build'")
    for row in rows:
        click.echo(_line(row))


def _line(row: ImageRow) -> str:
    sizes = f"{row.size / MIB:7.0f} MiB"
    if row.base_size is not None and row.env_size is not None:
        sizes += (f" = {row.overhead:.3f} x (base {row.base_size / MIB:.0f} MiB"
                  f" + env {row.env_size / MIB:.0f} MiB)")
    tag = next((t for t in row.tags if "-" in t.rpartition(":")[2]), row.id[7:19])
    return f"{tag:60} {row.lock_digest[:12]}  {sizes}"
