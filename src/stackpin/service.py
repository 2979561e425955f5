"""Run a cell's service (Unsloth Studio) from its built image on the build host.

The same declaration as the image's HEALTHCHECK and the bundle's bin/start.sh
(``stackpin.matrix.Service``): the port is published on 127.0.0.1 only, the state folder
and the models folder are mounted where the service expects them, and "up" means the
health path answers ``{"status": "healthy"}``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stackpin.engine import BindMount, RunRequest
from stackpin.errors import ConfigurationError, HostEnvironmentError, VerificationError
from stackpin.healthcheck import healthy
from stackpin.matrix import Cell, Variant
from stackpin.runprofile import with_run_profile, without_devices
from stackpin.servicespec import LOOPBACK, Service
from stackpin.target import LABEL_PROFILE, LABEL_STATE


@dataclass(frozen=True, kw_only=True)
class ServePlan:
    """Everything one run of a service needs, resolved before Docker is touched."""

    request: RunRequest
    url: str
    health_url: str
    timeout_s: int
    password_file: Path  # on the host, inside the state folder


def service_of(cell: Cell) -> Service:
    if cell.service is None:
        msg = f"cell {cell.id} declares no service: add [cells.{cell.id}.service] to its matrix"
        raise ConfigurationError(msg)
    return cell.service


def plan(
    cell: Cell,
    variant: Variant,
    *,
    image: str,
    state_dir: Path,
    models_dir: Path,
    port: int | None = None,
    timeout_s: int | None = None,
    devices: str | None = None,
    no_devices: bool = False,
) -> ServePlan:
    """The container run of one variant's service (pure: no Docker, no files touched).

    The cell's run profile (device nodes, shm, ulimits, the cards in ``devices`` or the
    cell's default) is applied as bin/start.sh applies it, so Studio sees the cards.
    ``no_devices`` runs it without the device flags and device-host mounts (a GPU image on a
    host with no card: runprofile.without_devices): the image's launcher then starts Studio
    on unsloth's CPU fallback, and says so.
    """
    service = service_of(cell)
    if no_devices:
        if devices is not None:
            msg = f"--devices {devices} and --no-devices contradict each other; pass one"
            raise ConfigurationError(msg)
        cell = without_devices(cell)
    host_port = port if port is not None else service.endpoint(variant).port
    if not models_dir.is_dir():
        msg = (
            f"models folder {models_dir} is missing: create it and put model folders "
            "(safetensors or GGUF) in it, or pass --models DIR"
        )
        raise ConfigurationError(msg)
    request = with_run_profile(RunRequest(
        image=image,
        command=service.argv(variant),
        environment={"STACKPIN_PROFILE": variant},
        mounts=(
            BindMount(source=state_dir.resolve(), target=service.state_dir),
            BindMount(source=models_dir.resolve(), target=service.models_dir, read_only=True),
        ),
        ports={service.container_port: host_port},
        workdir=service.state_dir,
        # The state folder names the run: one service per state folder, and tests find theirs.
        labels={LABEL_PROFILE: variant, LABEL_STATE: str(state_dir.resolve())},
    ), cell, devices=devices, no_devices=no_devices)
    inside = service.bootstrap_password().removeprefix(service.state_dir).lstrip("/")
    return ServePlan(
        request=request,
        url=f"http://{LOOPBACK}:{host_port}/",
        health_url=f"http://{LOOPBACK}:{host_port}{service.health_path}",
        timeout_s=timeout_s if timeout_s is not None else service.ready_timeout,
        password_file=state_dir / inside,
    )


def port_in_use(port: int) -> bool:
    """Whether something already listens on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((LOOPBACK, port)) == 0


def require_free_port(port: int) -> None:
    if port_in_use(port):
        msg = f"port {LOOPBACK}:{port} is taken: stop what uses it or pass --port"
        raise HostEnvironmentError(msg)


def wait_healthy(
    url: str,
    *,
    timeout_s: int,
    exit_code: Callable[[], int | None],
    logs: Callable[[], str],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once ``url`` answers healthy; raise when the service exits or time runs out.

    ``exit_code`` is None while the container runs. The error carries the service's last
    log lines, since they are what says why it never came up.
    """
    deadline = clock() + timeout_s
    why = "no answer yet"
    while True:
        ok, why = healthy(url)
        if ok:
            return
        code = exit_code()
        if code is not None:
            msg = f"the service exited with code {code} while starting; its log is below"
            raise VerificationError(msg, details=_tail(logs()))
        if clock() >= deadline:
            msg = f"the service was not healthy after {timeout_s}s ({why}); its log is below"
            raise VerificationError(msg, details=_tail(logs()))
        sleep(1.0)


def _tail(text: str, lines: int = 30) -> list[str]:
    return text.splitlines()[-lines:]
