"""One image of a ``docker save`` stream unpacked into a folder (timestamp normalisation)."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from stackpin.engine.save_format import read_save
from stackpin.errors import BuildError
from stackpin.primitives import CHUNK


@dataclass(frozen=True, kw_only=True)
class SavedImage:
    """One image of a ``docker save`` stream unpacked into a folder: config + layer files."""

    config: Mapping[str, Any]
    layers: tuple[Path, ...]  # in config order; the same file may appear twice
    layer_digests: Mapping[Path, str]


def unpack_save(stream: IO[bytes], folder: Path) -> SavedImage:
    """Spool a one-image ``docker save`` stream (either layout): layers to files, uncompressed."""
    count = itertools.count()

    def spool(data: IO[bytes]) -> Path:
        path = folder / f"in-{next(count)}.tar"
        with path.open("wb") as out:
            shutil.copyfileobj(data, out, CHUNK)
        return path

    contents = read_save(stream, spool)
    if len(contents.entries) != 1:
        msg = f"docker save gave {len(contents.entries)} images where one was asked for"
        raise BuildError(msg)
    layers = contents.layers_of(contents.entries[0])
    return SavedImage(
        config=contents.entries[0].config,
        layers=tuple(layer.value for layer in layers),
        layer_digests={layer.value: layer.diff_id for layer in contents.layers.values()},
    )
