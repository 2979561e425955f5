"""One place that lists the verb modules; each exposes a click command or group ``command``."""

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


def register_all(group: click.Group) -> None:
    for name in VERB_MODULES:
        try:
            module = importlib.import_module(f"stackpin.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"stackpin.cli.{name}":
                raise
            continue
        group.add_command(module.command)
