"""`stackpin ci matrix`: hand every cell x variant to an existing CI engine."""

from __future__ import annotations

import json
from pathlib import Path

import click

from stackpin import cimatrix
from stackpin.cli.common import all_cells, project_root
from stackpin.errors import ConfigurationError


def _lock_digests(root: Path, cell_ids: list[str]) -> dict[str, str]:
    """The lock digest of each cell that has a lock; unlocked cells get no digest tag."""
    digests: dict[str, str] = {}
    for cell_id in cell_ids:
        path = root / "pinning" / "locks" / f"{cell_id}.lock"
        if not path.is_file():
            continue
        try:
            digest = json.loads(path.read_text(encoding="utf-8")).get("digest", "")
        except (json.JSONDecodeError, AttributeError):
            msg = f"{path}: not a lock (JSON with a 'digest'); regenerate it with stackpin lock"
            raise ConfigurationError(msg) from None
        if isinstance(digest, str) and digest:
            digests[cell_id] = digest
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
    digests = _lock_digests(project_root(), sorted(cells))
    click.echo(cimatrix.render(result, fmt, lock_digests=digests), nl=False)
    if explain:
        click.echo(cimatrix.explain(result), nl=False, err=True)
