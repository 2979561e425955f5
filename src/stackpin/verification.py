"""Run the in-image verification suite (reading and comparing reports: stackpin.reports).

The suite itself lives in verify/ (``python -m stackpin_verify``) and knows nothing of
stackpin; this module only decides how to run it (the cell's device flags, a bind mount
for the reports, a time limit) and reads what it wrote.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackpin.engine import BindMount, Engine, RunRequest, RunResult
from stackpin.errors import HostEnvironmentError, VerificationError
from stackpin.lock import write_text_atomic
from stackpin.matrix import Cell
from stackpin.primitives import pretty_json
from stackpin.reports import read_report
from stackpin.runprofile import with_run_profile
from stackpin.target import Target

IN_CONTAINER_REPORTS = "/stackpin-reports"
SUITE_TIMEOUT_S = 1800


@dataclass(frozen=True, kw_only=True)
class SuiteRun:
    """One image's verification: where its reports are, what they say, how the run ended."""

    target: Target
    image: str
    result: RunResult
    report: dict[str, Any]

    @property
    def report_path(self) -> Path:
        return self.target.report_dir / "report.json"

    @property
    def passed(self) -> bool:
        return self.result.exit_code == 0

    def summary(self) -> dict[str, Any]:
        return {"cell": self.target.cell.id, "variant": self.target.variant,
                "image": self.image, "report": str(self.report_path),
                "summary": self.report["summary"]}


def run_suite(engine: Engine, target: Target, *, levels: str, dtype: str,
              devices: bool = True) -> SuiteRun:
    """Run the suite in the target's built image into a fresh report folder, read the
    report it wrote and record which image it is about (verified.json)."""
    image = target.tags[0]
    info = engine.image_info(image)
    if info is None:
        msg = (f"image {image} is not built: run 'stackpin build {target.cell.id} "
               f"--variant {target.variant}'")
        raise HostEnvironmentError(msg)
    out_dir = target.report_dir
    if out_dir.exists():
        shutil.rmtree(out_dir)  # last run's reports must not pass for this one's
    out_dir.mkdir(parents=True)
    request = verify_request(target.cell, image, out_dir=out_dir.resolve(), levels=levels,
                             dtype=dtype, devices=devices)
    result = engine.run_to_completion(request, timeout_s=SUITE_TIMEOUT_S)
    if not (out_dir / "report.json").exists():
        msg = (f"the suite wrote no report in {image} (exit {result.exit_code}): "
               f"{result.logs.strip().splitlines()[-1:] or ['no output']}")
        raise VerificationError(msg)
    report = read_report(out_dir / "report.json")
    write_verified(target, info.id)
    return SuiteRun(target=target, image=image, result=result, report=report)


def verify_request(
    cell: Cell, image: str, *, out_dir: Path, levels: str, dtype: str, devices: bool = True
) -> RunRequest:
    """The container run of the suite with the platform's device flags and no network.

    ``devices=False`` runs it without them, on a host with no card (a CUDA image in CI):
    the kernel levels then say ``unsupported: no device``, they never pass.
    """
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
        environment={"PYTHONUNBUFFERED": "1"},
    )
    return with_run_profile(request, cell, no_devices=not devices)


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
