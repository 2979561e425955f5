"""``stackpin doctor``: the engine stackpin talks to, and what cannot work with it."""

from __future__ import annotations

import shutil
import subprocess

import click

from stackpin.cli.common import echo_json, json_option
from stackpin.doctor import Diagnosis
from stackpin.engine.docker_api import DockerEngine
from stackpin.errors import HostEnvironmentError


def buildx_version() -> str:
    """`docker buildx version`'s version word, or "" without the docker CLI or the plugin."""
    if shutil.which("docker") is None:
        return ""
    done = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True,
                          check=False)
    words = done.stdout.split()
    return words[1] if done.returncode == 0 and len(words) > 1 else ""


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
