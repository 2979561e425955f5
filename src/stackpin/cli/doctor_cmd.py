"""``stackpin doctor``: the engine stackpin talks to, and what cannot work with it."""

from __future__ import annotations

import click

from stackpin.cli.common import echo_json, json_option
from stackpin.doctor import Diagnosis
from stackpin.engine.buildx import buildx_version
from stackpin.engine.docker_api import DockerEngine
from stackpin.errors import HostEnvironmentError


@click.command("doctor")
@json_option
def command(as_json: bool) -> None:
    """Engine version, API version, image store, builder, BuildKit, cgroups, runtimes.

    Exits 8 with one line per problem when the combination cannot work.
    """
    with DockerEngine.connect() as engine:
        diagnosis = Diagnosis(report=engine.report(), buildx=buildx_version())
    if as_json:
        echo_json(diagnosis.to_json())
    else:
        for line in diagnosis.lines():
            click.echo(line)
    problems = diagnosis.problems()
    if problems:
        raise HostEnvironmentError("; ".join(problems))
