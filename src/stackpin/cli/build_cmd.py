"""``stackpin build``: offline image builds of a cell's variants."""

from __future__ import annotations

from pathlib import Path

import click

from stackpin import session
from stackpin.build import execute, plan, stage
from stackpin.cli.common import (
    ENGINE,
    ExistingPath,
    build_options,
    cell_argument,
    echo_json,
    json_option,
    project_layout,
    say_builder,
    variant_option,
)
from stackpin.cli.progress import StepProgress
from stackpin.engine.buildx import buildx_version


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
    prepared = session.prepare(project_layout(), cell_id, variant)
    root = prepared.layout.root
    if prepare_only:
        for target in prepared.targets:
            build_plan = plan(target, no_cache=no_cache, provenance=dict(prepared.provenance))
            stage(build_plan, root)
            tags = ", ".join(build_plan.request.tags)
            click.echo(f"context: {build_plan.context_dir}/ (tags {tags})")
        return
    progress = StepProgress(verbose=verbose)
    records = []
    with ENGINE.open() as engine:
        started = session.start(engine, prepared, requested_builder=builder,
                                buildx=buildx_version(), base_tar=base_tar, offline=offline,
                                on_line=progress)
        say_builder(started.builder)
        for target in prepared.targets:
            record = execute(engine, started.plan(target, no_cache=no_cache), root=root,
                             base_id=started.base_id, on_line=progress,
                             normalize=not no_normalize)
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
