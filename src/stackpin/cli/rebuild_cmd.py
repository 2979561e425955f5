"""``stackpin rebuild --check``: prove an image is reproducible, or say what differs."""

from __future__ import annotations

import click

from stackpin.bootstrap import ensure_base
from stackpin.build import plan, preflight, vet_cell
from stackpin.cache import cache_dir
from stackpin.cli.build_cmd import build_options, builder_for, provenance_labels
from stackpin.cli.common import (
    cell_argument,
    echo_json,
    json_option,
    project_layout,
    variant_option,
)
from stackpin.cli.progress import StepProgress
from stackpin.engine.docker_api import DockerEngine
from stackpin.errors import VerificationError
from stackpin.rebuild import RebuildReport, check_rebuild, differing_paths, report_lines
from stackpin.target import resolve


@click.command(name="rebuild")
@cell_argument
@click.option("--check", is_flag=True,
              help="Rebuild from scratch (no cache, normalised) and compare with the built "
                   "image; exit 6 when they differ.")
@variant_option(help="Which image(s) of the cell to check.")
@click.option("--use-cache", is_flag=True,
              help="Reuse cached layers: only steps that miss the cache are rebuilt and "
                   "checked (quick iteration, tests); the full check is without it.")
@click.option("--image", "image_ref", metavar="REF",
              help="Compare with this image (tag or ID, e.g. one loaded from a bundle) "
                   "instead of the variant's lock-digest tag; needs a single variant.")
@build_options
@json_option
def command(cell_id: str, check: bool, variant: str, use_cache: bool, image_ref: str | None,
            builder: str, verbose: bool, as_json: bool) -> None:
    """Rebuild CELL's images from scratch and compare them with the ones already built.

    Use the builder the image was built with (--builder, as for `stackpin build`: the
    same auto choice on the same engine). Identical image IDs pass. Otherwise every
    differing config field is listed, and every differing layer with each path inside it
    and what differs (content, mtime, mode, owner, or only in one image); --json gives
    the full report for CI. The rebuilt image is built under a temporary tag and removed
    afterwards.
    """
    if not check:
        msg = "only --check is implemented; to rebuild for use, run `stackpin build --no-cache`"
        raise click.UsageError(msg)
    layout = project_layout()
    root = layout.root
    targets = resolve(layout, cell_id, variant, vet=vet_cell)
    cell = targets[0].cell
    if image_ref and len(targets) != 1:
        choices = ", ".join(cell.variants)
        msg = f"--image names one image; pick its variant with --variant ({choices})"
        raise click.UsageError(msg)
    preflight(targets[0])
    provenance = provenance_labels(root)
    progress = StepProgress(verbose=verbose)
    reports: list[RebuildReport] = []
    with DockerEngine.connect() as engine:
        base = ensure_base(engine, cell, cache_dir=cache_dir(), on_line=progress)
        choice = builder_for(engine, builder)
        for target in targets:
            build_plan = plan(target, no_cache=not use_cache, provenance=provenance,
                              builder=choice)
            report = check_rebuild(engine, build_plan, root=root, base_id=base.image_id,
                                   on_line=progress, no_cache=not use_cache,
                                   existing_ref=image_ref)
            progress.done()
            reports.append(report)
            if not as_json:
                for line in report_lines(report):
                    click.echo(line)
    if as_json:
        echo_json({"pass": all(r.identical for r in reports),
                   "reports": [r.to_json() for r in reports]})
    failed = [r for r in reports if not r.identical]
    if failed:
        paths = sorted({p for r in failed for p in differing_paths(r)})
        named = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        layers = sum(len(r.layers) for r in failed)
        msg = (
            f"{', '.join(r.reference for r in failed)} is not reproducible: {layers} layer(s) "
            f"differ ({named or 'config only'}); make the step that writes them deterministic"
        )
        raise VerificationError(msg)
