"""`stackpin ci matrix`: hand every cell x variant to an existing CI engine."""

from __future__ import annotations

from pathlib import Path

import click

from stackpin import cimatrix
from stackpin.cli.common import all_cells, project_root
from stackpin.lock import read_lock, stale_reason
from stackpin.matrix import Cell


def _lock_digests(root: Path, cells: dict[str, Cell]) -> dict[str, str]:
    """Lock digest of each cell whose lock is current; a stale lock would not build."""
    digests: dict[str, str] = {}
    for cell_id, cell in sorted(cells.items()):
        lock = read_lock(root, cell_id)
        if lock is not None and stale_reason(lock, cell) is None:
            digests[cell_id] = lock.digest
    return digests


@click.group(name="ci")
def command() -> None:
    """Export the matrix to CI engines (GitHub Actions, GitLab CI, BuildKit bake)."""


@command.command(name="matrix")
@click.option(
    "--format", "fmt", type=click.Choice(cimatrix.FORMATS), default="github", show_default=True,
    help="github: strategy.matrix JSON; gitlab: parallel:matrix YAML; bake: docker-bake.hcl.",
)
@click.option("--select", "globs", multiple=True, metavar="GLOB", help="Cell ids to keep (repeat).")
@click.option(
    "--platform", "platforms", multiple=True, type=click.Choice(cimatrix.PLATFORMS),
    help="Platforms to keep (repeat).",
)
@click.option(
    "--runner-kinds", default=",".join(cimatrix.PLATFORMS), show_default=True,
    help="Comma-separated platforms your CI has runners for; other cells are excluded.",
)
@click.option("--explain", is_flag=True, help="Print the excluded cells and why on stderr.")
def matrix(fmt: str, globs: tuple[str, ...], platforms: tuple[str, ...], runner_kinds: str,
           explain: bool) -> None:
    """Every selected cell x variant as a CI matrix; exclusions carry a reason.

    \b
    GitHub:  strategy: {matrix: {include: ${{ fromJSON(needs.m.outputs.matrix).include }}}}
    GitLab:  paste the block under a job with tags: ["$PLATFORM", "$ARCH"]
    bake:    stackpin ci matrix --format bake > docker-bake.hcl && docker buildx bake
    """
    cells = all_cells()
    selection = cimatrix.Selection(
        globs=globs,
        platforms=tuple(sorted(set(platforms))),
        runner_kinds=cimatrix.parse_runner_kinds(runner_kinds),
    )
    result = cimatrix.plan(cells, selection)
    digests = _lock_digests(project_root(), cells)
    click.echo(cimatrix.render(result, fmt, lock_digests=digests), nl=False)
    if explain:
        click.echo(cimatrix.explain(result), nl=False, err=True)
