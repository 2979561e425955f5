"""Run the in-image verification suite (reading and comparing reports: stackpin.reports).

The suite itself lives in verify/ (``python -m stackpin_verify``) and knows nothing of
stackpin; this module only decides how to run it (the cell's device flags, a bind mount
for the reports, a time limit) and reads what it wrote.
"""

from __future__ import annotations

from pathlib import Path

from stackpin.engine import BindMount, RunRequest, with_run_flags
from stackpin.matrix import Cell

IN_CONTAINER_REPORTS = "/stackpin-reports"


def verify_request(
    cell: Cell, image: str, *, out_dir: Path, levels: str, dtype: str
) -> RunRequest:
    """The container run of the suite with the platform's device flags and no network."""
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
    return with_run_flags(request, cell.run)
