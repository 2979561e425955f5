"""``stackpin doctor``: the engine stackpin talks to, and what cannot work with it."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import click

from stackpin.cli.common import ENGINE, echo_json, json_option
from stackpin.doctor import Diagnosis
from stackpin.engine.buildx import buildx_version
from stackpin.engine.types import EngineReport
from stackpin.errors import HostEnvironmentError


@click.command("doctor")
@json_option
def command(as_json: bool) -> None:
    """Engine version, API version, image store, builder, BuildKit, cgroups, runtimes.

    Exits 8 with one line per problem when the combination cannot work.
    """
    with ENGINE.open() as engine:
        report = engine.report()
    diagnosis = Diagnosis(report=report, buildx=buildx_version(), disk_free=local_disk_free(report))
    if as_json:
        echo_json(diagnosis.to_json())
    else:
        for line in diagnosis.lines():
            click.echo(line)
    problems = diagnosis.problems()
    if problems:
        raise HostEnvironmentError("; ".join(problems))


def local_disk_free(report: EngineReport) -> int | None:
    """Free bytes under the daemon's DockerRootDir, when the daemon runs on this host: its
    name is this host's and the folder exists here. A daemon in a VM (Docker Desktop) or on
    another machine keeps its data elsewhere, and a folder of the same name here says nothing."""
    if not report.root_dir or report.host_name != socket.gethostname():
        return None
    if not Path(report.root_dir).is_dir():
        return None
    return shutil.disk_usage(report.root_dir).free
