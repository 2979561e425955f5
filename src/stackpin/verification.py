"""Run the in-image verification suite (reading and comparing reports: stackpin.reports).

The suite itself lives in verify/ (``python -m stackpin_verify``) and knows nothing of
stackpin; this module only decides how to run it (the cell's device flags, a bind mount
for the reports, a time limit) and reads what it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from stackpin.engine import BindMount, RunRequest
from stackpin.lock import write_text_atomic
from stackpin.matrix import Cell
from stackpin.primitives import pretty_json
from stackpin.runprofile import with_run_profile, without_devices
from stackpin.target import Target

IN_CONTAINER_REPORTS = "/stackpin-reports"


def verify_request(
    cell: Cell, image: str, *, out_dir: Path, levels: str, dtype: str, devices: bool = True
) -> RunRequest:
    """The container run of the suite with the platform's device flags and no network.

    ``devices=False`` runs it without them, on a host with no card (a CUDA image in CI):
    the kernel levels then say ``unsupported: no device``, they never pass.
    """
    extra = {}
    if not devices:
        cell = without_devices(cell)
        extra = {"STACKPIN_NO_DEVICES": "1"}  # stackpin_verify.level0.NO_DEVICES_ENV
    command = ["python", "-m", "stackpin_verify", "--out-dir", IN_CONTAINER_REPORTS]
    if levels:
        command += ["--levels", levels]
    if dtype != "auto":
        command += ["--dtype", dtype]
    request = RunRequest(
        image=image,
        command=tuple(command),
        mounts=(BindMount(source=out_dir, target=IN_CONTAINER_REPORTS),),
        # The suite needs no network: it builds its tiny model and tokenizer in code.
        network_mode="none",
        environment={"PYTHONUNBUFFERED": "1", **extra},
    )
    return with_run_profile(request, cell)


def write_verified(target: Target, image_id: str) -> None:
    """Name the image the reports in target.report_dir are about; bundles select by it."""
    data = {"cell": target.cell.id, "variant": target.variant,
            "lock_digest": target.lock.digest, "image_id": image_id}
    write_text_atomic(target.layout.verified_path(target.cell.id, target.variant),
                      pretty_json(data))


def verified_image(target: Target) -> str | None:
    """The image ID the target's reports were made in, when they match its lock."""
    path = target.layout.verified_path(target.cell.id, target.variant)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("lock_digest") != target.lock.digest:
        return None
    image_id = data.get("image_id")
    return image_id if isinstance(image_id, str) else None
