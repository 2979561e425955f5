"""``stackpin render``: the Dockerfile and build files of one cell x variant."""

from __future__ import annotations

from pathlib import Path

import click

from stackpin import __version__
from stackpin.cli.common import cell_argument, output_folder, project_layout, variant_option
from stackpin.context import read_sources, write_rendered
from stackpin.engine.builders import Builder
from stackpin.render import Rendered, RenderRequest, render
from stackpin.target import Layout, load_cell, optional_lock, selected_variants
from stackpin.tools import load_installer


def render_cell(cell_id: str, variant: str, layout: Layout, *,
                builder: Builder = "classic") -> Rendered:
    """Render one cell x variant; without a lock yet the requirements files are empty."""
    cell = load_cell(layout, cell_id)
    (chosen,) = selected_variants(cell, variant)
    return render(
        RenderRequest(
            cell=cell,
            variant=chosen,
            lock=optional_lock(layout, cell),
            sources=read_sources(layout.templates),
            stackpin_version=__version__,
            builder=builder,
            installer=load_installer(layout.root),
        )
    )


@click.command(name="render")
@cell_argument
@variant_option(allow_all=False, help="Which image of the cell.")
@click.option(
    "-o", "--output", type=output_folder(), help="Write the build files to this folder."
)
@click.option(
    "--builder", type=click.Choice(["classic", "buildkit"]), default="classic",
    show_default=True,
    help="The Dockerfile for this builder: classic (an install stage copied into the final "
         "one) or buildkit (one stage, the wheels bind-mounted into each install).",
)
def command(cell_id: str, variant: str, output: Path | None, builder: Builder) -> None:
    """Render the Dockerfile of CELL (default: the CPU default cell).

    Without -o the Dockerfile is printed. With -o the folder receives the Dockerfile,
    the hash-locked requirements of each install layer, the build guard, the entrypoint
    and image.json. The output is byte-identical for identical inputs. Unpinned vendor
    hashes are allowed here; 'stackpin build' refuses them.
    """
    rendered = render_cell(cell_id, variant, project_layout(), builder=builder)
    if output is None:
        click.echo(rendered.dockerfile, nl=False)
        return
    write_rendered(rendered, output)
    click.echo(f"rendered {cell_id} ({variant}) into {output}/", err=True)
