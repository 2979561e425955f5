"""`stackpin report grid`: one compatibility grid from many verification reports."""

from __future__ import annotations

from pathlib import Path

import click

from stackpin import comparison
from stackpin import grid as gridlib
from stackpin import reports as reportlib
from stackpin.cli.common import ExistingPath, project_root
from stackpin.errors import ConfigurationError, VerificationError
from stackpin.lock import write_text_atomic
from stackpin.matrix import Cell
from stackpin.matrixfile import load_cells
from stackpin.target import VERIFIED_NAME


def _report_files(paths: tuple[Path, ...]) -> list[Path]:
    """Files as given; a directory (a downloaded CI artifact, build/reports/) adds every
    *.json under it but the verified.json `stackpin verify` writes beside each report."""
    files: list[Path] = []
    for path in paths:
        files += sorted(p for p in path.rglob("*.json") if p.name != VERIFIED_NAME) \
            if path.is_dir() else [path]
    return files


def _cells(folder: Path | None) -> dict[str, Cell]:
    folder = folder if folder is not None else project_root() / "pinning"
    if not folder.is_dir():
        msg = f"--cells-from {folder}: no such folder; point it at the pinning/ matrices"
        raise ConfigurationError(msg)
    return load_cells(sorted(folder.glob("*.toml")))


@click.group(name="report")
def command() -> None:
    """Merge verification reports from many cells and hosts."""


@command.command(name="grid")
@click.argument("reports", nargs=-1, required=True, type=ExistingPath("either"))
@click.option(
    "-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
    default=Path("build/grid"), show_default=True, help="Folder for grid.md/.html/.json/.xml.",
)
@click.option(
    "--baseline", type=ExistingPath("folder"),
    help="A previous grid output folder; worse checks and moved numbers are marked.",
)
@click.option(
    "--threshold", type=click.FloatRange(min=0.0), default=0.10, show_default=True,
    help="Relative move of a key number that counts as a change against the baseline.",
)
@click.option(
    "--cells-from", type=ExistingPath("folder"),
    help="Matrix folder whose cells x variants get a 'not run' row when no report covers "
    "them [default: pinning/].",
)
def grid(reports: tuple[Path, ...], out_dir: Path, baseline: Path | None, threshold: float,
         cells_from: Path | None) -> None:
    """Merge REPORT.json files (or folders of them) into one grid.

    Rows are cell x variant, columns the checks by level; a shipped cell x variant
    with no report is 'not run'. With --baseline, exits 6 when anything regressed.
    """
    # No report at all (every cell failed before verify) still gives a grid: all 'not run'.
    rows = [reportlib.parse_report(str(p), reportlib.read_document(p))
            for p in _report_files(reports)]
    result = reportlib.build_grid(rows, _cells(cells_from))
    if baseline is not None:
        old_path = baseline / "grid.json"
        old = comparison.parse_baseline(str(old_path), reportlib.read_document(old_path))
        result = comparison.compare(result, old, source=str(baseline), threshold=threshold)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in gridlib.render_all(result).items():
        write_text_atomic(out_dir / name, text)
    click.echo(f"{gridlib.summary_line(result)}; wrote {out_dir}/grid.{{md,html,json,xml}}")
    if result.regressions:
        first = result.regressions[0]
        msg = (
            f"{len(result.regressions)} regression(s) against {baseline}, first: {first.row} "
            f"{first.name} {first.detail}; see {out_dir}/grid.md"
        )
        raise VerificationError(msg)
