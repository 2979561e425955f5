"""Build a cell's images: refuse bad input before Docker works, then one offline build.

Order of a build, each step able to stop it with a one-line error:
1. preflight (pure): cross-checks, pinned hashes, lock current and complete, wheelhouse
   identical to the lock;
2. base (stackpin.bootstrap.ensure_base): bootstrapped from Debian packages, or an image
   present locally / loaded from a tar / pulled, and checked against its pinned digest;
3. context staged under build/context/<cell>-<variant>/ (rendered files, verify/, the
   locked wheels hard-linked);
4. BuildKit (through buildx) or the classic builder (stackpin.engine.builders picks) runs
   with network "none", so every RUN step is offline: a green build proves the site can
   rebuild air-gapped from the wheelhouse;
5. normalisation (stackpin.normalize, on unless --no-normalize): layers and config
   rewritten so the image ID depends only on what was installed; the tags move to it.
   Skipped where the image is reproducible as built (native: BuildKit 0.13+ clamps the
   config, the Dockerfile's steps clamp what they wrote).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stackpin import __version__
from stackpin.cache import cache_dir
from stackpin.checks import check_cell
from stackpin.context import context_digest, read_sources, stage_context
from stackpin.engine import BuildRequest, BuildResult, Engine, RunRequest
from stackpin.engine.builders import CLASSIC, BuilderChoice
from stackpin.errors import HostEnvironmentError, StackpinError, ValidationError
from stackpin.layers import install_layers
from stackpin.lock import Lock, write_text_atomic
from stackpin.matrix import Cell, Variant, pinned_wheels
from stackpin.normalize import NormalizeRequest, normalize_image
from stackpin.primitives import pretty_json
from stackpin.render import Rendered, RenderRequest, render
from stackpin.target import LABEL_CONTEXT_DIGEST, LABEL_DOCKERFILE_SHA256, Layout, Target
from stackpin.tools import load_installer, require_installer
from stackpin.wheelhouse import require_complete

LineSink = Callable[[str], None]


def vet_cell(cell: Cell) -> None:
    """The matrix rules and pinned hashes a build needs, checked before the lock is read."""
    errors = [v for v in check_cell(cell) if v.severity == "error"]
    if errors:
        msg = f"{errors[0]} ({len(errors)} violation(s); 'stackpin matrix check' lists all)"
        raise ValidationError(
            msg,
            details=[str(v) for v in errors],
        )
    for where, wheel in pinned_wheels(cell):
        if not wheel.sha256 and (where != "attention" or cell.locks_attention):
            msg = (
                f"{cell.id}: {where} {wheel.filename} is unpinned (empty sha256); a build "
                f"installs only pinned vendor wheels: set it from `sha256sum wheels/vendor/"
                f"{wheel.filename}`"
            )
            raise ValidationError(msg)


def preflight(target: Target) -> None:
    """What must hold before Docker does any work, given a vetted cell and a current lock:
    a complete lock and a wheelhouse identical to it."""
    require_complete(target.lock, target.cell, target.layout.root)
    require_installer(load_installer(target.layout.root), target.layout.root)


@dataclass(frozen=True, kw_only=True)
class BuildPlan:
    """What one variant's build will do; built before Docker is touched (tests assert on it)."""

    target: Target
    rendered: Rendered
    request: BuildRequest

    @property
    def cell(self) -> Cell:
        return self.target.cell

    @property
    def variant(self) -> Variant:
        return self.target.variant

    @property
    def lock(self) -> Lock:
        return self.target.lock

    @property
    def context_dir(self) -> Path:
        return self.target.context_dir


def plan(target: Target, *, no_cache: bool, provenance: dict[str, str],
         builder: BuilderChoice = CLASSIC) -> BuildPlan:
    """Render and describe the build (pure apart from reading templates)."""
    cell, lock = target.cell, target.lock
    rendered = render(
        RenderRequest(
            cell=cell, variant=target.variant, lock=lock,
            sources=read_sources(target.layout.templates), stackpin_version=__version__,
            builder=builder.builder, installer=load_installer(target.layout.root),
        )
    )
    made = {
        LABEL_DOCKERFILE_SHA256: sha256_text(rendered.dockerfile),
        LABEL_CONTEXT_DIGEST: context_digest(rendered, target.layout.root / "verify", lock.digest),
    }
    request = BuildRequest(
        context_dir=target.context_dir,
        tags=target.tags,
        # Build-time labels hold what the pure render cannot know (the source commit) and
        # what the build was made from, so its record can be matched to the image.
        labels={**provenance, **made},
        network_mode="none",
        nocache=no_cache,
        # Context files get this mtime and normalised modes: checkout time and umask
        # must not reach the COPY layers.
        source_date_epoch=cell.source_date_epoch,
        log_path=target.log_path,
        builder=builder.builder,
        rewrite_timestamps=builder.rewrite_timestamps,
        native_timestamps=builder.native_timestamps,
    )
    return BuildPlan(target=target, rendered=rendered, request=request)


def stage(plan_: BuildPlan, root: Path) -> None:
    stage_context(
        plan_.rendered, plan_.lock, root=root, folder=plan_.context_dir,
        layers=install_layers(plan_.cell, plan_.variant, plan_.lock),
        tools=(load_installer(root).path(root),),
    )


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    """What a finished build measured; `stackpin images` and the benchmarks read it."""

    cell: str
    variant: Variant
    image_id: str
    tags: tuple[str, ...]
    lock_digest: str
    seconds: float
    steps: int
    cached_steps: int
    image_size: int
    base_size: int
    env_size: int
    log_path: str
    # The classic builder's own image (kept as the layer cache) and the time the
    # normalisation took; equal IDs and 0 s with --no-normalize.
    raw_image_id: str = ""
    normalize_seconds: float = 0.0
    # What the build was made from: the Dockerfile (its text is kept beside the record),
    # the context and the base; bundles and provenance read these, never re-render.
    dockerfile_sha256: str = ""
    context_digest: str = ""
    base_reference: str = ""
    base_id: str = ""
    # "classic" or "buildkit"; how the timestamps were made reproducible: "native" (the
    # engine's BuildKit), "normalised" (stackpin.normalize) or "as built" (--no-normalize).
    builder: str = "classic"
    timestamps: str = ""
    # The image's package inventory as the SBOM probe printed it in the build's own
    # measuring container (stackpin.sbom.parse_probe reads it); "" where it could not run.
    inventory: str = ""

    def to_json(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def measure_image(engine: Engine, image: str) -> tuple[int, str]:
    """Bytes under /opt/stackpin in the image (the installed environment, via du) and its
    package inventory (the SBOM probe's JSON line; "" where the probe cannot run), from one
    container: a bundle export reads the inventory from the build record instead of
    starting a container of its own beside the save (issue 24)."""
    from stackpin import sbom  # CycloneDX's libraries load only where an inventory is read

    result = engine.run_to_completion(
        RunRequest(image=image, entrypoint=("/bin/sh",),
                   command=("-c", 'du -sb /opt/stackpin && { "$0" -c "$1" || true; }',
                            sbom.PYTHON, sbom.PROBE),
                   network_mode="none"),
        timeout_s=600,
    )
    if result.exit_code != 0:
        msg = f"cannot measure /opt/stackpin in {image}: {result.logs.strip()[:200]}"
        raise HostEnvironmentError(msg)
    size, _, probed = result.stdout.partition("\n")
    try:
        sbom.parse_probe(probed, image=image)
    except StackpinError:
        return int(size.split()[0]), ""
    return int(size.split()[0]), probed.strip().splitlines()[-1]


def execute(
    engine: Engine,
    plan_: BuildPlan,
    *,
    root: Path,
    base_id: str,
    on_line: LineSink,
    normalize: bool = True,
) -> BuildRecord:
    """Stage the context, build, normalise, measure, and write the build record atomically."""
    stage(plan_, root)
    started = time.monotonic()
    result: BuildResult = engine.build(plan_.request, on_line=on_line)
    seconds = time.monotonic() - started
    base = engine.image_info(base_id)
    assert base is not None
    image_id, normalize_seconds = result.image_id, 0.0
    timestamps = "native" if result.native_timestamps else "as built"
    if normalize and not result.native_timestamps:
        normalized = normalize_image(engine, NormalizeRequest(
            image=result.image_id, tags=result.tags, keep_diff_ids=frozenset(base.diff_ids),
            work_dir=plan_.target.layout.tmp, cache_dir=cache_dir(),
            layers_as_built=result.builder == "buildkit",
        ), on_line=on_line)
        image_id, normalize_seconds = normalized.image_id, normalized.seconds
        timestamps = "normalised"
    image = engine.image_info(image_id)
    assert image is not None
    env_size, inventory = measure_image(engine, image_id)
    record = BuildRecord(
        cell=plan_.cell.id, variant=plan_.variant, image_id=image_id, tags=result.tags,
        lock_digest=plan_.lock.digest, seconds=round(seconds, 2), steps=result.steps,
        cached_steps=result.cached_steps, image_size=image.size, base_size=base.size,
        env_size=env_size, log_path=str(result.log_path),
        raw_image_id=result.image_id, normalize_seconds=normalize_seconds,
        dockerfile_sha256=plan_.request.labels[LABEL_DOCKERFILE_SHA256],
        context_digest=plan_.request.labels[LABEL_CONTEXT_DIGEST],
        base_reference=plan_.rendered.base_reference, base_id=base.id,
        builder=result.builder, timestamps=timestamps, inventory=inventory,
    )
    write_record(plan_.target, record, plan_.rendered.dockerfile)
    return record


def write_record(target: Target, record: BuildRecord, dockerfile: str) -> None:
    """The record and the Dockerfile that built the image; the Dockerfile first, so a
    record never names a Dockerfile that is not there."""
    write_text_atomic(target.layout.dockerfile_record_path(target.cell.id, target.variant),
                      dockerfile)
    write_text_atomic(target.record_path,
                      pretty_json(record.to_json()))


def load_record(target: Target) -> BuildRecord | None:
    """The build record of ``target``, or None when it was never built here."""
    data = read_record(target.layout.root, target.cell.id, target.variant)
    if data is None:
        return None
    known = {f.name for f in dataclasses.fields(BuildRecord)}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
    try:
        return BuildRecord(**fields)  # type: ignore[arg-type]
    except TypeError:
        return None


def built_dockerfile(target: Target, *, image_id: str, labels: Mapping[str, str]) -> tuple[
        BuildRecord, str]:
    """The record and Dockerfile that made ``image_id``, or ValidationError in one line.

    The record must exist, name this image and lock, and its Dockerfile must hash to what
    the record and the image's label say: otherwise the files would describe a build
    that did not make the image.
    """
    rebuild = f"rebuild it with `stackpin build {target.cell.id} --variant {target.variant}`"
    record = load_record(target)
    if record is None or not record.dockerfile_sha256:
        msg = f"{target.name}: no build record with its Dockerfile in {target.record_path}; "
        raise ValidationError(msg + rebuild)
    if record.image_id != image_id or record.lock_digest != target.lock.digest:
        msg = (f"{target.name}: the build record names image {record.image_id[:19]} (lock "
               f"{record.lock_digest[:12]}), not {image_id[:19]} (lock "
               f"{target.lock.digest[:12]}); ")
        raise ValidationError(msg + rebuild)
    path = target.layout.dockerfile_record_path(target.cell.id, target.variant)
    dockerfile = path.read_text(encoding="utf-8") if path.is_file() else ""
    found = sha256_text(dockerfile)
    if found != record.dockerfile_sha256 or labels.get(LABEL_DOCKERFILE_SHA256) != found:
        msg = f"{target.name}: {path} is not the Dockerfile that built {image_id[:19]}; "
        raise ValidationError(msg + rebuild)
    return record, dockerfile


def read_record(root: Path, cell_id: str, variant: Variant) -> dict[str, object] | None:
    path = Layout(root).record_path(cell_id, variant)
    if not path.exists():
        return None
    data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return data
