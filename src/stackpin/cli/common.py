"""Options and helpers shared by the verbs: each option is declared here, once, and the
engine every verb talks to is reached through one seam (``ENGINE``) that the unit tests
fill with the shared fake (tests/fake_engine.py)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, TypeVar

import click

from stackpin import platforms
from stackpin.bundle import trust
from stackpin.engine import Engine
from stackpin.engine.builders import BUILDER_CHOICES, BuilderChoice
from stackpin.matrix import VARIANTS, Cell
from stackpin.matrixfile import load_cells
from stackpin.servicespec import Service
from stackpin.target import Layout, variant_choices

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CELL = "cpu-bookworm-torch2130-py311"


class EngineSeam:
    """How a verb reaches its engine: the Docker daemon (as the docker CLI finds it), or
    what a test put in ``factory``. Opened inside a ``with``; closed when it ends."""

    def __init__(self) -> None:
        self.factory: Callable[[], AbstractContextManager[Engine]] = _docker

    def open(self) -> AbstractContextManager[Engine]:
        return self.factory()


def _docker() -> AbstractContextManager[Engine]:
    # Imported here: docker-py loads only for verbs that reach a daemon.
    from stackpin.engine.docker_api import DockerEngine

    return DockerEngine.connect()


ENGINE = EngineSeam()


def project_root() -> Path:
    """The folder holding pinning/: the current directory or the nearest parent with one."""
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / "pinning").is_dir():
            return folder
    return here


def project_layout() -> Layout:
    return Layout(project_root())


def all_cells(root: Path | None = None) -> dict[str, Cell]:
    """Every shipped cell (only listing verbs need them all; see target.load_cell)."""
    return load_cells(Layout(root or project_root()).matrix_files())


def cell_argument(func: F) -> F:
    """[CELL]: one cell id, the CPU default cell when left out."""
    return click.argument("cell_id", default=DEFAULT_CELL, metavar="[CELL]")(func)


def cells_argument(func: F) -> F:
    """[CELL...]: one or more cell ids, the CPU default cell when left out."""
    return click.argument("cell_ids", nargs=-1, metavar="[CELL...]")(func)


def variant_option(*, allow_all: bool = True, help: str = "Which image(s) of the cell.") -> \
        Callable[[F], F]:
    """--variant: stable|enhanced, plus 'all' (the default) for verbs that loop over them."""
    return click.option(
        "--variant", type=click.Choice(variant_choices(allow_all=allow_all)),
        default="all" if allow_all else "stable", show_default=True, help=help,
    )


def builder_option(func: F) -> F:
    """--builder: auto (BuildKit where the engine and the docker CLI have it), buildkit, classic."""
    return click.option(
        "--builder", type=click.Choice(BUILDER_CHOICES), default="auto", show_default=True,
        help="auto prefers BuildKit (the daemon's, through docker buildx) and falls back to "
             "the classic builder where there is none; buildkit refuses to fall back.",
    )(func)


def build_options(func: F) -> F:
    """--builder and -v: which builder runs and how much of it is shown (build, rebuild)."""
    verbose = click.option("-v", "--verbose", is_flag=True,
                           help="Print every build line, not just steps.")
    return builder_option(verbose(func))


def say_builder(choice: BuilderChoice) -> None:
    """The one line that says which builder runs and why (build, rebuild)."""
    click.echo(f"builder: {choice.builder} ({choice.reason})", err=True)


def trust_options(func: F) -> F:
    """--pubkey and --insecure-unsigned: the site's key for a bundle (inspect, verify, load)."""
    func = click.option(
        "--insecure-unsigned", is_flag=True,
        help=f"Skip the signature check (also {trust.INSECURE_ENV}=1); every line then says "
             "so. Only for bundles from a source you trust by other means.")(func)
    return click.option(
        "--pubkey", type=ExistingPath("file"),
        help=f"The signer's stackpin.pub. Default: ${trust.PUBKEY_ENV}, else "
             f"{trust.SITE_TRUST_FILE}. Without a trusted key the bundle is refused.")(func)


def service_ports() -> str:
    """The declared ports of the service, by variant: 'stable 18888, enhanced 18887'."""
    return ", ".join(f"{v} {Service().endpoint(v).port}" for v in VARIANTS)


def devices_help() -> str:
    """How the platforms with cards are told which to use, from their specs:
    'HIP_VISIBLE_DEVICES on DTK and ROCm, CUDA_VISIBLE_DEVICES on CUDA'."""
    by_variable: dict[str, list[str]] = {}
    for spec in platforms.specs():
        if spec.visibility_env:
            by_variable.setdefault(spec.visibility_env, []).append(spec.title)
    return ", ".join(f"{variable} on {' and '.join(titles)}"
                     for variable, titles in by_variable.items())


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(
        func
    )


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


class ExistingPath(click.Path):
    """A path argument that must exist and be of its kind: a missing path, a folder where a
    file is wanted (or the reverse), a device or a fifo is a usage error (exit 2), found
    while the command line is read, before the verb does anything."""

    def __init__(self, kind: Literal["file", "folder", "either"]) -> None:
        super().__init__(exists=True, file_okay=kind != "folder", dir_okay=kind != "file",
                         path_type=Path)
        self.kind = kind

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        mode = Path(os.fsdecode(path)).stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            self.fail(f"{click.format_filename(path)!r} is a device, fifo or socket, not a "
                      f"{'file or folder' if self.kind == 'either' else self.kind}", param, ctx)
        return path


def output_folder() -> click.Path:
    """A folder a verb writes into (created when missing): an existing file there is a usage
    error, not something to write over."""
    return click.Path(file_okay=False, path_type=Path)
