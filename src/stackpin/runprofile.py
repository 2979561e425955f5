"""The run profile of a cell: the container settings the field runs its images with.

Declared once, in the cell's ``[run]`` table (``stackpin.matrix.RunFlags``): device nodes,
groups, mounts, shared memory, ulimits and the card-visibility variable. `stackpin serve`
and `stackpin verify` apply it to their RunRequest here; the bundle's bin/start.sh and
bin/verify.sh read the same table as docker options from bin/profiles/<profile>.conf
(``stackpin.bundle.siteconf``). A site chooses its cards at run time (``--devices 0,1``):
the cell's ``visible_devices`` is only the default.
"""

from __future__ import annotations

from dataclasses import replace

from stackpin.engine.types import RunRequest, with_run_flags
from stackpin.errors import ConfigurationError
from stackpin.matrix import Cell, visibility_environment, visibility_variable
from stackpin.matrix_safety import VISIBLE


def chosen_devices(cell: Cell, devices: str | None) -> str:
    """The cards a run may use: the site's choice, else the cell's default ("" = all).

    A choice on a platform without cards, or one that is not a card list, is refused
    before anything runs (bin/start.sh applies the same rule in bash).
    """
    if devices is None:
        return cell.run.visible_devices
    if not visibility_variable(cell.platform):
        msg = (f"--devices {devices}: cell {cell.id} runs on {cell.platform} and has no cards "
               "to choose; leave --devices out")
        raise ConfigurationError(msg)
    if not VISIBLE.fullmatch(devices):
        msg = f"--devices '{devices}' is not a card list: give indices such as 0,1"
        raise ConfigurationError(msg)
    return devices


# Named once on each side of the container boundary (stackpin_verify.level0.NO_DEVICES_ENV,
# templates/serve.py; a parity test holds them equal): the run passed no device flags on
# purpose, so the suite reports what needs a card as unsupported and Studio starts on
# unsloth's CPU fallback.
NO_DEVICES_ENV = "STACKPIN_NO_DEVICES"


def without_devices(cell: Cell) -> Cell:
    """The cell as run on a host with no card (``--no-devices``): no device nodes, no GPU
    request, no card choice; none of the [run] volumes, which mount the device host's
    driver side (/opt/hyhal on DCU hosts): where no card is, Docker would create an empty
    host folder for each and hide what the image holds at that path; and no memlock limit,
    which exists to pin host memory for the cards' DMA: with no card nothing pins it, and a
    daemon without CAP_SYS_RESOURCE (a CI host's: hard limit 8 MiB) refuses to start any
    container that asks for memlock=-1. The other limits (stack) and shm stay."""
    kept = tuple(u for u in cell.run.ulimits if u.partition("=")[0] != "memlock")
    run = replace(cell.run, devices=(), gpus="", visible_devices="", volumes=(), ulimits=kept)
    return replace(cell, run=run)


def with_run_profile(request: RunRequest, cell: Cell, *, devices: str | None = None,
                     no_devices: bool = False) -> RunRequest:
    """The request plus the cell's run profile, the visibility variable set to the cards
    chosen (``chosen_devices``); with ``no_devices`` the profile without its device flags,
    and the container told so (``NO_DEVICES_ENV``)."""
    if no_devices:
        if devices is not None:
            msg = f"--devices {devices} and --no-devices contradict each other: give one"
            raise ConfigurationError(msg)
        request = replace(request, environment={**request.environment, NO_DEVICES_ENV: "1"})
        cell = without_devices(cell)
    run = replace(cell.run, visible_devices=chosen_devices(cell, devices))
    environment = {**request.environment, **visibility_environment(cell.platform, run)}
    return replace(with_run_flags(request, run), environment=environment)
