"""``stackpin rebuild --check``: prove an image is reproducible, or say what differs."""

from __future__ import annotations

import click

from stackpin import session
from stackpin.cli.common import (
    ENGINE,
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
from stackpin.errors import VerificationError
from stackpin.rebuild import RebuildReport, check_rebuild, differing_paths, report_lines


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
    prepared = session.prepare(project_layout(), cell_id, variant)
    if image_ref and len(prepared.targets) != 1:
        choices = ", ".join(prepared.targets[0].cell.variants)
        msg = f"--image names one image; pick its variant with --variant ({choices})"
        raise click.UsageError(msg)
    progress = StepProgress(verbose=verbose)
    reports: list[RebuildReport] = []
    with ENGINE.open() as engine:
        started = session.start(engine, prepared, requested_builder=builder,
                                buildx=buildx_version(), on_line=progress)
        say_builder(started.builder)
        for target in prepared.targets:
            report = check_rebuild(engine, started.plan(target, no_cache=not use_cache),
                                   root=prepared.layout.root, base_id=started.base_id,
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
