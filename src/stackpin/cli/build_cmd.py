"""``stackpin build``: offline image builds of a cell's variants."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click

from stackpin import __version__
from stackpin.bootstrap import ensure_base
from stackpin.build import execute, plan, preflight, stage, vet_cell
from stackpin.bundle.source import load_bundled_base, recorded_commit
from stackpin.cache import cache_dir
from stackpin.cli.common import (
    ExistingPath,
    F,
    builder_option,
    cell_argument,
    echo_json,
    json_option,
    project_layout,
    variant_option,
)
from stackpin.cli.progress import StepProgress
from stackpin.engine.builders import BuilderChoice, select_builder
from stackpin.engine.buildx import buildx_version
from stackpin.engine.docker_api import DockerEngine
from stackpin.target import LABEL_SOURCE_COMMIT, LABEL_VERSION, OCI_REVISION, resolve


def source_commit(root: Path) -> str:
    """HEAD of the checkout, '+dirty' when tracked files differ; outside git, the commit a
    bundle folder records (SOURCE_COMMIT), else 'unknown'."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        # A --with-wheels bundle is a project without git: it records its images' commit.
        return recorded_commit(root) or "unknown"
    return f"{head}+dirty" if dirty else head


def provenance_labels(root: Path) -> dict[str, str]:
    commit = source_commit(root)
    return {
        OCI_REVISION: commit,
        LABEL_SOURCE_COMMIT: commit,
        LABEL_VERSION: __version__,
    }


def builder_for(engine: DockerEngine, requested: str) -> BuilderChoice:
    """The builder this engine and the docker CLI give for --builder (one line says which)."""
    choice = select_builder(requested, report=engine.report(), buildx=buildx_version())
    click.echo(f"builder: {choice.builder} ({choice.reason})", err=True)
    return choice


def build_options(func: F) -> F:
    """--builder and -v: which builder runs and how much of it is shown (build, rebuild)."""
    verbose = click.option("-v", "--verbose", is_flag=True,
                           help="Print every build line, not just steps.")
    return builder_option(verbose(func))


@click.command(name="build")
@cell_argument
@variant_option(help="Which image(s) of the cell to build.")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer.")
@click.option("--base-tar", type=ExistingPath("file"),
              help="Load the base image from this `docker save` tar first (air-gapped sites).")
@click.option("--no-normalize", is_flag=True,
              help="Keep the builder's image as is (build-time mtimes and dates): faster, "
                   "but its ID changes with every --no-cache build (unless the engine's "
                   "BuildKit rewrites timestamps natively).")
@build_options
@click.option("--offline", is_flag=True,
              help="Never reach a network for the base: it must be on the daemon or in base/ "
                   "of a --with-wheels bundle (run inside the bundle folder).")
@click.option("--prepare-only", is_flag=True,
              help="Stage build/context/CELL-VARIANT/ (Dockerfile + locked wheels) and stop; "
                   "for external builders such as `docker buildx bake`.")
@json_option
def command(cell_id: str, variant: str, no_cache: bool, base_tar: Path | None,
            no_normalize: bool, builder: str, offline: bool, verbose: bool,
            prepare_only: bool, as_json: bool) -> None:
    """Build CELL's images offline from the locked wheelhouse (default: CPU default cell).

    Refuses, before Docker does any work: matrix violations, unpinned vendor hashes, a
    missing/stale/incomplete lock, a wheelhouse that differs from the lock. Every RUN
    step runs with networking disabled. The result is normalised, or its timestamps
    rewritten by the engine's BuildKit where it can (docs/reproducibility.md), so the same
    cell gives the same image ID on any day and host. Images are tagged
    stackpin/CELL:VARIANT-<lock digest 12 hex> and stackpin/CELL:VARIANT. The full log
    is saved under build/logs/CELL-VARIANT.log.
    """
    layout = project_layout()
    root = layout.root
    targets = resolve(layout, cell_id, variant, vet=vet_cell)
    preflight(targets[0])
    provenance = provenance_labels(root)
    if prepare_only:
        for target in targets:
            build_plan = plan(target, no_cache=no_cache, provenance=provenance)
            stage(build_plan, root)
            tags = ", ".join(build_plan.request.tags)
            click.echo(f"context: {build_plan.context_dir}/ (tags {tags})")
        return
    progress = StepProgress(verbose=verbose)
    records = []
    with DockerEngine.connect() as engine:
        if offline:
            load_bundled_base(engine, targets[0].cell, root, on_line=progress)
        base = ensure_base(engine, targets[0].cell, cache_dir=cache_dir(), base_tar=base_tar,
                           on_line=progress)
        choice = builder_for(engine, builder)
        for target in targets:
            build_plan = plan(target, no_cache=no_cache, provenance=provenance, builder=choice)
            record = execute(engine, build_plan, root=root, base_id=base.image_id,
                             on_line=progress, normalize=not no_normalize)
            progress.done()
            records.append(record)
            if not as_json:
                click.echo(
                    f"build: {record.tags[0]} ({record.image_id[7:19]}, "
                    f"{record.image_size / 2**20:.0f} MiB, {record.cached_steps}/{record.steps} "
                    f"steps cached, {record.builder}, {record.seconds:.0f} s, timestamps "
                    f"{record.timestamps}{_took(record.normalize_seconds)}); log {record.log_path}"
                )
    if as_json:
        echo_json([r.to_json() for r in records])


def _took(seconds: float) -> str:
    return f" in {seconds:.0f} s" if seconds else ""
