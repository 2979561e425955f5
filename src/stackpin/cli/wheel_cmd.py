"""``stackpin wheel inspect``: what a wheel filename says about its ABI."""

from __future__ import annotations

from pathlib import Path

import click

from stackpin.abi import WheelInfo, parse_wheel_filename
from stackpin.cli.common import echo_json, json_option


@click.group(name="wheel")
def command() -> None:
    """Read ABI facts from wheel filenames (tags and vendor local-version labels)."""


@command.command(name="inspect")
@click.argument("wheels", nargs=-1, required=True, metavar="NAME.whl...")
@json_option
def inspect(wheels: tuple[str, ...], as_json: bool) -> None:
    """Parse wheel filenames (the files need not exist): tags, glibc floor, vendor label.

    Understands Hygon DAS labels (das.opt1.dtk2604.torch290, das185.dtk2604.torch2110.
    <date>.g<hash>, das.opt1.dtk24043, das1.1.git<hash>.abi1.dtk2404) and upstream
    FlashAttention / PyTorch labels (cu12torch2.8cxx11abiTRUE, cu128torch2.9, cpu,
    rocm6.4). Tokens it does not know are listed under unknown_tokens, never dropped.
    A name is only a claim: 'stackpin verify' runs the kernels.
    """
    infos = [parse_wheel_filename(Path(name).name) for name in wheels]
    if as_json:
        echo_json([info.to_json() for info in infos] if len(infos) > 1 else infos[0].to_json())
        return
    for info in infos:
        _print(info)


def _print(info: WheelInfo) -> None:
    click.echo(info.filename)
    # Every fact of the JSON form that the name states (one key per platform whose label
    # names a version: stackpin.platforms), in that order.
    for key, value in info.to_json().items():
        if value is not None and key not in ("filename", "unknown_tokens"):
            click.echo(f"  {key:13} {value}")
    if info.unknown_tokens:
        click.echo(f"  {'unknown':13} {' '.join(info.unknown_tokens)} (kept, not understood)")
