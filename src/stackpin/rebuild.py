"""The rebuild check: build a cell again from scratch and explain any difference.

The comparison is pure: two images are described by their config and, for each layer, a
summary of every member (type, mode, owner, mtime, size, content sha256, link target);
``diff_images`` pairs the layers by position and names each differing path with the kind
of difference. ``snapshot_images`` fills those summaries from ONE ``docker save`` stream of
both images (a layer they share is read once), hashing member contents on the way: no
temp files, nothing held but the summaries.
"""

from __future__ import annotations

import tarfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Literal

from stackpin.build import BuildPlan, stage
from stackpin.engine import Engine, SaveRequest, chunk_stream
from stackpin.engine.save_format import read_save
from stackpin.errors import HostEnvironmentError
from stackpin.matrix import Variant
from stackpin.normalize import NormalizeRequest, normalize_image
from stackpin.primitives import hash_stream
from stackpin.tarstream import read_tar_stream

Kind = Literal["content", "mtime", "mode", "owner", "only_in_existing", "only_in_rebuilt"]
_TYPES = {
    tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "char",
    tarfile.BLKTYPE: "block", tarfile.FIFOTYPE: "fifo",
}


@dataclass(frozen=True, kw_only=True)
class MemberSummary:
    """What a layer says about one path."""

    type: str
    mode: int
    uid: int
    gid: int
    owner_names: str  # "uname:gname" as written in the tar
    mtime: int
    size: int
    sha256: str  # of the content; "" for anything but a regular file
    linkname: str

    def to_json(self) -> dict[str, object]:
        return {
            "type": self.type, "mode": f"{self.mode:04o}", "uid": self.uid, "gid": self.gid,
            "owner_names": self.owner_names, "mtime": self.mtime, "size": self.size,
            "sha256": self.sha256, "linkname": self.linkname,
        }


def member_summary(info: tarfile.TarInfo, data: IO[bytes] | None) -> MemberSummary:
    digest = hash_stream(data)[1] if data is not None else ""
    return MemberSummary(
        type=_TYPES.get(info.type, info.type.decode("ascii", "replace")),
        mode=info.mode, uid=info.uid, gid=info.gid, owner_names=f"{info.uname}:{info.gname}",
        mtime=int(info.mtime), size=info.size if info.isfile() else 0, sha256=digest,
        linkname=info.linkname,
    )


def summarize_layer(stream: IO[bytes]) -> dict[str, MemberSummary]:
    """Every member of a layer tar read front to back (a stream is enough)."""
    found: dict[str, MemberSummary] = {}
    with read_tar_stream(stream) as tar:
        for info in tar:
            data = tar.extractfile(info) if info.isfile() else None
            found[info.name.removeprefix("./")] = member_summary(info, data)
    return found


# --- pure comparison -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PathDiff:
    path: str
    kinds: tuple[Kind, ...]
    existing: MemberSummary | None
    rebuilt: MemberSummary | None

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "kinds": list(self.kinds),
            "existing": self.existing.to_json() if self.existing else None,
            "rebuilt": self.rebuilt.to_json() if self.rebuilt else None,
        }


def path_kinds(a: MemberSummary, b: MemberSummary) -> tuple[Kind, ...]:
    kinds: list[Kind] = []
    if (a.type, a.size, a.sha256, a.linkname) != (b.type, b.size, b.sha256, b.linkname):
        kinds.append("content")
    if a.mtime != b.mtime:
        kinds.append("mtime")
    if a.mode != b.mode:
        kinds.append("mode")
    if (a.uid, a.gid, a.owner_names) != (b.uid, b.gid, b.owner_names):
        kinds.append("owner")
    return tuple(kinds)


def diff_members(
    existing: Mapping[str, MemberSummary], rebuilt: Mapping[str, MemberSummary]
) -> tuple[PathDiff, ...]:
    """Each path that differs between two layers, sorted, with what differs."""
    found: list[PathDiff] = []
    for path in sorted(existing.keys() | rebuilt.keys()):
        a, b = existing.get(path), rebuilt.get(path)
        if a is None or b is None:
            kind: Kind = "only_in_rebuilt" if a is None else "only_in_existing"
            found.append(PathDiff(path=path, kinds=(kind,), existing=a, rebuilt=b))
        elif kinds := path_kinds(a, b):
            found.append(PathDiff(path=path, kinds=kinds, existing=a, rebuilt=b))
    return tuple(found)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON document as dotted paths to leaves (lists by index)."""
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


@dataclass(frozen=True, kw_only=True)
class ConfigDiff:
    field: str
    existing: Any
    rebuilt: Any

    def to_json(self) -> dict[str, object]:
        return {"field": self.field, "existing": self.existing, "rebuilt": self.rebuilt}


def diff_configs(existing: Mapping[str, Any], rebuilt: Mapping[str, Any]) -> tuple[ConfigDiff, ...]:
    """Config fields that differ; the layer list is left to the layer comparison."""
    def fields(config: Mapping[str, Any]) -> dict[str, Any]:
        return flatten({k: v for k, v in config.items() if k != "rootfs"})

    a, b = fields(existing), fields(rebuilt)
    missing = object()
    return tuple(
        ConfigDiff(field=key, existing=a.get(key), rebuilt=b.get(key))
        for key in sorted(a.keys() | b.keys())
        if a.get(key, missing) != b.get(key, missing)
    )


@dataclass(frozen=True, kw_only=True)
class ImageSnapshot:
    """An image as the comparison sees it."""

    image_id: str
    config: Mapping[str, Any]
    layers: Mapping[str, Mapping[str, MemberSummary]]  # diff_id -> path -> summary

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple((self.config.get("rootfs") or {}).get("diff_ids") or ())


@dataclass(frozen=True, kw_only=True)
class LayerDiff:
    index: int  # 1-based, as `docker history` counts from the bottom
    created_by: str
    existing: str | None  # diff_id, None when the image has no such layer
    rebuilt: str | None
    paths: tuple[PathDiff, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "index": self.index, "created_by": self.created_by, "existing": self.existing,
            "rebuilt": self.rebuilt, "paths": [p.to_json() for p in self.paths],
        }


@dataclass(frozen=True, kw_only=True)
class RebuildReport:
    reference: str
    existing_id: str
    rebuilt_id: str
    config: tuple[ConfigDiff, ...] = ()
    layers: tuple[LayerDiff, ...] = ()

    @property
    def identical(self) -> bool:
        return self.existing_id == self.rebuilt_id

    def to_json(self) -> dict[str, object]:
        return {
            "reference": self.reference,
            "pass": self.identical,
            "existing": self.existing_id,
            "rebuilt": self.rebuilt_id,
            "config": [c.to_json() for c in self.config],
            "layers": [layer.to_json() for layer in self.layers],
        }


def _layer_commands(config: Mapping[str, Any]) -> list[str]:
    """created_by of each non-empty history entry: what made each layer."""
    return [
        str(h.get("created_by", "")) for h in config.get("history") or ()
        if not h.get("empty_layer")
    ]


def diff_images(reference: str, existing: ImageSnapshot, rebuilt: ImageSnapshot) -> RebuildReport:
    """Everything that differs between two images, layer by layer and path by path."""
    if existing.image_id == rebuilt.image_id:
        return RebuildReport(reference=reference, existing_id=existing.image_id,
                             rebuilt_id=rebuilt.image_id)
    a_ids, b_ids = existing.diff_ids, rebuilt.diff_ids
    commands = _layer_commands(rebuilt.config) or _layer_commands(existing.config)
    layers: list[LayerDiff] = []
    for i in range(max(len(a_ids), len(b_ids))):
        a = a_ids[i] if i < len(a_ids) else None
        b = b_ids[i] if i < len(b_ids) else None
        if a == b:
            continue
        members_a = existing.layers.get(a, {}) if a else {}
        members_b = rebuilt.layers.get(b, {}) if b else {}
        layers.append(LayerDiff(
            index=i + 1, created_by=commands[i] if i < len(commands) else "",
            existing=a, rebuilt=b, paths=diff_members(members_a, members_b),
        ))
    return RebuildReport(
        reference=reference, existing_id=existing.image_id, rebuilt_id=rebuilt.image_id,
        config=diff_configs(existing.config, rebuilt.config), layers=tuple(layers),
    )


# --- text ----------------------------------------------------------------------------


def _describe_path(diff: PathDiff) -> str:
    a, b = diff.existing, diff.rebuilt
    notes: list[str] = []
    for kind in diff.kinds:
        if kind == "content" and a and b:
            notes.append(
                f"content ({a.type} {a.size} B {a.sha256[:12] or a.linkname} -> "
                f"{b.type} {b.size} B {b.sha256[:12] or b.linkname})"
            )
        elif kind == "mtime" and a and b:
            notes.append(f"mtime ({a.mtime} -> {b.mtime})")
        elif kind == "mode" and a and b:
            notes.append(f"mode ({a.mode:04o} -> {b.mode:04o})")
        elif kind == "owner" and a and b:
            notes.append(f"owner ({a.uid}:{a.gid} {a.owner_names} -> {b.uid}:{b.gid} "
                         f"{b.owner_names})")
        else:
            notes.append(kind.replace("_", " "))
    return f"/{diff.path}: {', '.join(notes)}"


def report_lines(report: RebuildReport, *, max_paths: int = 20) -> Iterator[str]:
    """The human-readable report (the JSON form lists every path)."""
    if report.identical:
        yield f"rebuild check: {report.reference} is reproducible ({report.existing_id})"
        return
    yield (
        f"rebuild check: {report.reference} DIFFERS: existing {report.existing_id}, "
        f"rebuilt {report.rebuilt_id}"
    )
    for change in report.config:
        yield f"  config {change.field}: {change.existing!r} -> {change.rebuilt!r}"
    for layer in report.layers:
        yield (
            f"  layer {layer.index} ({layer.created_by.strip()[:90]}): "
            f"{layer.existing or 'absent'} -> {layer.rebuilt or 'absent'}"
        )
        if not layer.paths:
            yield "    same paths and metadata; the tar bytes differ (member order or headers)"
        for diff in layer.paths[:max_paths]:
            yield f"    {_describe_path(diff)}"
        if len(layer.paths) > max_paths:
            yield f"    ... and {len(layer.paths) - max_paths} more path(s) (--json lists all)"


def differing_paths(report: RebuildReport) -> list[str]:
    return sorted({f"/{p.path}" for layer in report.layers for p in layer.paths})


# --- reading images from the daemon --------------------------------------------------


def snapshot_images(engine: Engine, image_ids: Sequence[str]) -> dict[str, ImageSnapshot]:
    """Configs and layer summaries of several images from one ``docker save`` stream."""
    stream = chunk_stream(engine.save(SaveRequest(images=tuple(image_ids))))
    contents = read_save(stream, summarize_layer)
    layers = {layer.diff_id: layer.value for layer in contents.layers.values()}
    return {
        image_id: ImageSnapshot(
            image_id=image_id, config=contents.entry_for(image_id).config, layers=layers
        )
        for image_id in image_ids
    }


# --- the check: rebuild under a temporary tag, compare, clean up ----------------------


def temporary_tag(cell_id: str, variant: Variant) -> str:
    return f"stackpin/{cell_id}:rebuild-check-{variant}-{uuid.uuid4().hex[:12]}"


def check_rebuild(
    engine: Engine,
    plan_: BuildPlan,
    *,
    root: Path,
    base_id: str,
    on_line: Callable[[str], None],
    no_cache: bool = True,
    existing_ref: str | None = None,
) -> RebuildReport:
    """Build ``plan_`` again with no cache, normalise it (unless the engine wrote native
    timestamps) and compare with the existing image.

    The rebuilt image lives under a temporary tag and is removed in ``finally``, as is
    the classic builder's raw image of a no-cache rebuild; the existing image is never
    touched. ``no_cache=False`` reuses cached layers: only the steps that miss the cache
    are really rebuilt (a quick check, and how the tests keep CI short). ``existing_ref``
    names the image to compare with (default: the variant's lock-digest tag).
    """
    reference = existing_ref or plan_.request.tags[0]
    existing = engine.image_info(reference)
    if existing is None:
        msg = (
            f"no image {reference} to check: build it first with "
            f"`stackpin build {plan_.cell.id} --variant {plan_.variant}`"
        )
        raise HostEnvironmentError(msg)
    base = engine.image_info(base_id)
    assert base is not None
    temp = temporary_tag(plan_.cell.id, plan_.variant)
    request = replace(
        plan_.request, tags=(temp,), nocache=no_cache,
        log_path=root / "build" / "logs" / f"{plan_.cell.id}-{plan_.variant}-rebuild.log",
    )
    stage(plan_, root)
    raw_id = ""
    try:
        result = engine.build(request, on_line=on_line)
        raw_id = rebuilt_id = result.image_id
        if not result.native_timestamps:
            rebuilt_id = normalize_image(engine, NormalizeRequest(
                image=raw_id, tags=(temp,), keep_diff_ids=frozenset(base.diff_ids),
                work_dir=root / "build" / "tmp", layers_as_built=result.builder == "buildkit",
            ), on_line=on_line).image_id
        if rebuilt_id == existing.id:
            return RebuildReport(reference=reference, existing_id=existing.id,
                                 rebuilt_id=rebuilt_id)
        on_line(f"rebuild: {rebuilt_id} differs; reading both images to compare")
        snapshots = snapshot_images(engine, (existing.id, rebuilt_id))
        return diff_images(reference, snapshots[existing.id], snapshots[rebuilt_id])
    finally:
        _remove(engine, temp, on_line)
        # With the cache, the raw image may be the original build's own: keep it.
        if no_cache and raw_id and raw_id != existing.id:
            _remove(engine, raw_id, on_line)


def _remove(engine: Engine, reference: str, on_line: Callable[[str], None]) -> None:
    # A tag on the existing image is only untagged; the rebuilt image goes with its tag.
    try:
        engine.remove_image(reference)
    except Exception as exc:  # cleanup must not hide the check's own result or error
        on_line(f"rebuild: could not remove {reference} ({exc}); `docker rmi {reference}`")
