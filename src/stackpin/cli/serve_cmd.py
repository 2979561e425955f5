"""``stackpin serve``: run a built image's service (Unsloth Studio) on the build host."""

from __future__ import annotations

import json
from pathlib import Path

import click

from stackpin.cli.common import (
    ENGINE,
    cell_argument,
    devices_help,
    json_option,
    project_layout,
    service_ports,
    variant_option,
)
from stackpin.errors import HostEnvironmentError, VerificationError
from stackpin.matrix import Variant
from stackpin.service import plan, require_free_port, wait_healthy
from stackpin.target import resolve


@click.command(name="serve")
@cell_argument
@variant_option(allow_all=False, help=f"Which image's service ({service_ports()}).")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help=f"Host port on 127.0.0.1 (default: the variant's: {service_ports()}).")
@click.option("--models", "models_dir", type=click.Path(path_type=Path), default=Path("models"),
              show_default=True, help="Folder of model folders, mounted read-only.")
@click.option("--state", "state_dir", type=click.Path(path_type=Path), default=None,
              help="State folder (accounts, chats, runs); default build/state/CELL-VARIANT.")
@click.option("--timeout", "timeout_s", type=click.IntRange(1), default=None,
              help="Seconds to wait for a healthy answer (default: the cell's ready_timeout).")
@click.option("--devices", default=None, metavar="LIST",
              help=f"Cards the service may use, e.g. 0,1 ({devices_help()}); default: the "
                   "cell's [run] visible_devices.")
@click.option("--no-devices", is_flag=True,
              help="Run without the cell's device flags and device-host mounts, on a host "
                   "with no card: Studio starts on unsloth's CPU fallback (slow; for trying "
                   "the image, not for training on it).")
@json_option
def command(cell_id: str, variant: Variant, port: int | None, models_dir: Path,
            state_dir: Path | None, timeout_s: int | None, devices: str | None,
            no_devices: bool, as_json: bool) -> None:
    """Serve CELL's service from its built image until Ctrl-C, on 127.0.0.1 only.

    Waits until the health path answers healthy, prints the URL and where the first-login
    password was written, then keeps the service in the foreground; Ctrl-C stops and
    removes its container. Exit 3 for a missing models folder or a cell without a
    service, 6 when the service exits or is not healthy in time, 8 for a taken port or an
    image that is not built. The cell's run profile (device nodes, shm, ulimits) is applied
    as by the bundle's bin/start.sh. With --json, the only output is one JSON line once healthy
    (url, health_url, port, password_file or null, container, image, state_dir, models_dir).
    """
    layout = project_layout()
    (target,) = resolve(layout, cell_id, variant)
    cell, image = target.cell, target.tags[0]
    state = state_dir or layout.build / "state" / target.name
    serve = plan(cell, variant, image=image, state_dir=state, models_dir=models_dir,
                 port=port, timeout_s=timeout_s, devices=devices, no_devices=no_devices)
    require_free_port(next(iter(serve.request.ports.values())))
    state.mkdir(parents=True, exist_ok=True)
    with ENGINE.open() as engine:
        if engine.image_info(image) is None:
            msg = f"image {image} is not built: run 'stackpin build {cell.id} --variant {variant}'"
            raise HostEnvironmentError(msg)
        with engine.container(serve.request) as running:
            say = (lambda _line: None) if as_json else click.echo
            say(f"serve: starting {image} (waiting up to {serve.timeout_s}s for "
                f"{serve.health_url})")
            if no_devices and cell.spec.accelerator:
                say(f"serve: --no-devices: no {cell.platform} card is passed; Studio runs on "
                    "unsloth's CPU fallback")
            wait_healthy(serve.health_url, timeout_s=serve.timeout_s,
                         exit_code=lambda: running.wait(1), logs=running.logs)
            password = serve.password_file if serve.password_file.is_file() else None
            if as_json:
                click.echo(json.dumps({
                    "cell": cell.id, "variant": variant, "image": image,
                    "devices": not no_devices,
                    "container": running.id, "url": serve.url, "health_url": serve.health_url,
                    "port": next(iter(serve.request.ports.values())),
                    "password_file": str(password.resolve()) if password else None,
                    "state_dir": str(state.resolve()), "models_dir": str(models_dir.resolve()),
                }, sort_keys=True), nl=True)
            say(f"serve: {cell.id} {variant} healthy at {serve.url}")
            if password:
                say(f"serve: first login: user unsloth, password in {serve.password_file} "
                    "(change it at once: until then Studio shuts itself down after an hour)")
            say("serve: Ctrl-C stops it and removes the container")
            code = None
            while code is None:
                code = running.wait(3600)
            msg = f"the service exited on its own with code {code}; its last log lines follow"
            raise VerificationError(msg, details=running.logs().splitlines()[-30:])
