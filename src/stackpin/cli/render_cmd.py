"""``stackpin render``: the Dockerfile and build files of one cell x variant."""

from __future__ import annotations

from pathlib import Path

import click

from stackpin import __version__
from stackpin.cli.common import DEFAULT_CELL, cell_by_id, project_root
from stackpin.context import write_rendered
from stackpin.lock import read_lock
from stackpin.matrix import VARIANTS
from stackpin.render import Rendered, RenderRequest, render


def render_cell(cell_id: str, variant: str, root: Path) -> Rendered:
    cell = cell_by_id(cell_id, root)
    return render(
        RenderRequest(
            cell=cell,
            variant=variant,  # type: ignore[arg-type]
            lock=read_lock(root, cell.id),
            templates_dir=root / "templates",
            stackpin_version=__version__,
        )
    )


@click.command(name="render")
@click.argument("cell_id", default=DEFAULT_CELL, metavar="[CELL]")
@click.option("--variant", type=click.Choice(VARIANTS), default="stable", show_default=True)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="Write the build files to this folder."
)
def command(cell_id: str, variant: str, output: Path | None) -> None:
    """Render the Dockerfile of CELL (default: the CPU default cell).

    Without -o the Dockerfile is printed. With -o the folder receives the Dockerfile,
    the hash-locked requirements of each install layer, the build guard, the entrypoint
    and image.json. The output is byte-identical for identical inputs. Unpinned vendor
    hashes are allowed here; 'stackpin build' refuses them.
    """
    root = project_root()
    rendered = render_cell(cell_id, variant, root)
    if output is None:
        click.echo(rendered.dockerfile, nl=False)
        return
    write_rendered(rendered, output)
    click.echo(f"rendered {cell_id} ({variant}) into {output}/", err=True)
