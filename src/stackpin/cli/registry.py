"""One place that lists the verb modules; each exposes a click command or group ``command``,
imported when its verb is asked for."""

from __future__ import annotations

import importlib

import click

# Module names under stackpin.cli; a missing module (work in progress) is skipped so the
# tool keeps working while a verb is being written.
VERB_MODULES = (
    "matrix_cmd",
    "wheel_cmd",
    "render_cmd",
    "lock_cmd",
    "wheels_cmd",
    "build_cmd",
    "images_cmd",
    "verify_cmd",
    "bundle_cmd",
    "keys_cmd",
    "rebuild_cmd",
    "ci_cmd",
    "report_cmd",
    "doctor_cmd",
    "serve_cmd",
    "rehearsal_cmd",
)


def verbs() -> list[str]:
    """The verbs' names: each module's name without ``_cmd``."""
    return sorted(name.removesuffix("_cmd") for name in VERB_MODULES)


def load(verb: str) -> click.Command | None:
    """The verb's command, its module imported now: a run imports the one verb it runs,
    not every verb's modules (`stackpin bundle export --help`: 0.74-0.90 s)."""
    module_name = f"{verb}_cmd"
    if module_name not in VERB_MODULES:
        return None
    try:
        module = importlib.import_module(f"stackpin.cli.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"stackpin.cli.{module_name}":
            raise
        return None
    command: click.Command = module.command
    return command
