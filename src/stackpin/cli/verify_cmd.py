"""``stackpin verify``: run the verification suite inside a built image; compare reports."""

from __future__ import annotations

import json
from pathlib import Path

import click

from stackpin.cli.common import (
    ENGINE,
    ExistingPath,
    cell_argument,
    echo_json,
    json_option,
    project_layout,
    variant_option,
)
from stackpin.comparison import diff_reports, is_regression
from stackpin.errors import VerificationError
from stackpin.reports import read_report
from stackpin.target import resolve
from stackpin.verification import run_suite


class _VerifyGroup(click.Group):
    """`stackpin verify [CELL]` runs the suite; `stackpin verify diff A B` compares reports."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Anything but a subcommand or --help is the default action's CELL or options.
        if not args or args[0] not in (*self.commands, "-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(name="verify", cls=_VerifyGroup)
def command() -> None:
    """Prove an image works: kernels, JIT, attention, quantization gating, LoRA training,
    golden outputs, collectives (the verify/ suite, run inside the image).

    \b
    stackpin verify [CELL] [--variant V]   run the suite in CELL's built image(s)
    stackpin verify diff A.json B.json     what changed between two reports
    """


@command.command(name="run")
@cell_argument
@variant_option()
@click.option("--levels", default="", help="Comma-separated levels (default: all, 0-8).")
@click.option("--dtype", type=click.Choice(["auto", "bf16", "fp16", "fp32"]), default="auto",
              show_default=True)
@click.option("--no-devices", is_flag=True,
              help="Run without the cell's device flags, on a host with no card: the "
                   "kernel levels report unsupported, never pass.")
@json_option
def run(cell_id: str, variant: str, levels: str, dtype: str, no_devices: bool,
        as_json: bool) -> None:
    """Run the suite in CELL's image with the platform's device flags.

    Reports go to build/reports/CELL-VARIANT/report.json and report.xml (JUnit). Exit 6
    when a required check fails.
    """
    targets = resolve(project_layout(), cell_id, variant)
    cell = targets[0].cell
    failed: list[str] = []
    summaries = []
    with ENGINE.open() as engine:
        for target in targets:
            run = run_suite(engine, target, levels=levels, dtype=dtype, devices=not no_devices)
            summaries.append(run.summary())
            if not as_json:
                click.echo(run.result.stdout.rstrip())
                click.echo(f"verify: {run.image}: reports in {target.report_dir}/ "
                           "(report.json, report.xml)")
            if not run.passed:
                required = run.report["summary"]["required_failed"]
                failed.append(f"{target.variant} ({required} required failed)")
    if as_json:
        echo_json(summaries)
    if failed:
        msg = f"{cell.id}: required checks failed in {', '.join(failed)}; see the reports"
        raise VerificationError(msg)


@command.command(name="diff")
@click.argument("before", type=ExistingPath("file"))
@click.argument("after", type=ExistingPath("file"))
@click.option("--fail-on-regression", is_flag=True, help="Exit 6 when a check got worse.")
@json_option
def diff(before: Path, after: Path, fail_on_regression: bool, as_json: bool) -> None:
    """Show what changed from BEFORE to AFTER: statuses, versions, throughput ratios."""
    changes = diff_reports(read_report(before), read_report(after))
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in changes], indent=2))
    else:
        for change in changes:
            click.echo(str(change))
        if not changes:
            click.echo("no differences in statuses, versions or throughput")
    regressions = [c for c in changes if is_regression(c)]
    if fail_on_regression and regressions:
        msg = f"{len(regressions)} check(s) got worse: {regressions[0]}"
        raise VerificationError(msg)
