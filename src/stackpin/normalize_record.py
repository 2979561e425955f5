"""Normalisation without a save: only the config is rewritten, where the layers are
reproducible as built.

BuildKit's steps clamp what they write (templates/clamp.py) and every bind-mount target
and runtime file (/etc/hosts, /etc/resolv.conf, /etc/hostname) is laid down beforehand by
one ``ADD`` of a tar with fixed headers (``render.mount_stubs``), so no step leaves an entry
stamped with the time of the run: the engine's own layers are a function of the files.
Engine 20.10's BuildKit (0.8) still stamps the config (``created`` and every history
``created``) with the build time. Rewriting that needs no layer: the daemon's record of
the image (``/images/<id>/json`` and ``/history``) gives every field of the config, and a
``docker load`` of the new config and its manifest alone is enough on the classic store,
which holds every layer's chain already (save_format's ``omit``). That takes about a
second where save, rewrite and load of a 2 GiB image took 22 s (docs/benchmarks.md).

The config is rebuilt in one canonical form: the runtime settings that are set (the
daemon lists every field, zero or not), platform, history steps with the epoch as their
time and ``empty_layer`` where a step made no layer, and the layers as built. A step makes
a layer exactly when its history size is non-zero; where that count does not match the
layers (a step that wrote only empty files or folders), the record cannot say which steps
made them, and ``config_from_record`` returns None: the full normalisation runs instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from stackpin.engine import Engine
from stackpin.engine.save_format import held_layers_archive, sha256_digest
from stackpin.engine.types import ImageInfo, ImageRecord
from stackpin.errors import BuildError
from stackpin.primitives import canonical_bytes, rfc3339

# The classic builder's run fields (its step container's ID as hostname, the previous
# step's image): zero in a BuildKit image, and never part of a normal one.
_RUN_SETTINGS = frozenset({"Hostname", "Image"})


def set_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The runtime settings an image config carries: those the daemon reports as set."""
    return {key: value for key, value in sorted(settings.items())
            if key not in _RUN_SETTINGS and value not in (None, "", False, [], {})}


def config_from_record(record: ImageRecord, *, source_date_epoch: int) -> bytes | None:
    """The normal config's canonical bytes (their digest is the image ID), or None where
    the history cannot tell which steps made the layers."""
    if sum(1 for step in record.history if step.size > 0) != len(record.diff_ids):
        return None
    created = rfc3339(source_date_epoch)
    history = [
        {"created": created, "created_by": step.created_by,
         **({"comment": step.comment} if step.comment else {}),
         **({} if step.size > 0 else {"empty_layer": True})}
        for step in record.history
    ]
    config: dict[str, Any] = {
        "architecture": record.architecture, "os": record.os,
        **({"variant": record.variant} if record.variant else {}),
        **({"author": record.author} if record.author else {}),
        "config": set_settings(record.settings), "created": created, "history": history,
        "rootfs": {"type": "layers", "diff_ids": list(record.diff_ids)},
    }
    return canonical_bytes(config)


def normalize_config_only(
    engine: Engine, source: ImageInfo, *, source_date_epoch: int,
    on_line: Callable[[str], None],
) -> str | None:
    """Load the normal config of ``source`` (its layers as built) and return its image ID;
    None where this cannot be done (containerd store, an unreadable history)."""
    if engine.version().store != "classic":
        return None  # the containerd store wants every blob it lacks by digest
    record = engine.image_record(source.id)
    if record is None:
        msg = f"image {source.id} vanished from the daemon during normalisation"
        raise BuildError(msg)
    config = config_from_record(record, source_date_epoch=source_date_epoch)
    if config is None:
        on_line("normalize: the history does not say which steps made the layers; "
                "rewriting them")
        return None
    started = time.monotonic()
    config_digest = sha256_digest(config)
    present = engine.image_info(config_digest)
    if present is not None and present.id == config_digest:
        return present.id
    on_line(f"normalize: config only, the {len(record.diff_ids)} layers as built")
    loaded = engine.load(held_layers_archive(config, record.diff_ids))
    if config_digest not in loaded.image_ids:
        msg = (f"the daemon loaded {', '.join(loaded.image_ids) or 'nothing'} instead of the "
               f"normal config {config_digest}; rebuild with --no-normalize and report this")
        raise BuildError(msg)
    on_line(f"normalize: config written in {time.monotonic() - started:.1f} s")
    return config_digest
