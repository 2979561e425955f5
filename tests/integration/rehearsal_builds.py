"""The vendor rehearsal's images, built once a session through the real CLI (issue 21 item 3).

Each rehearsal cell goes the way a site's DTK or ROCm cell goes: its stand-ins are made into
wheels/vendor/ (``stackpin rehearsal make``, which must find the committed pins), its index
wheels fetched against the committed lock (never resolved again), then ``stackpin build
--variant all`` on the default engine, offline, with the engine's BuildKit (``--builder
buildkit``: the one-stage Dockerfile every Docker from 23 on uses by default) and without
normalisation (``--no-normalize``). Both for the disk: the classic builder writes each
variant's 2.6 GB environment twice more (its install stage, its final COPY) and
normalisation a third time; the classic path and normalisation are proved on the CPU image
and the engine matrix. A cell's images are removed as soon as its tests are done (``drop``),
so the disk holds one rehearsal cell at a time; what each step cost is kept in ``costs`` and
printed at the end of the session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import stackpin_cli

K100 = "rehearsal-dtk2604-k100-torch290-py311"
BW = "rehearsal-dtk2604-bw-torch2100-py311"
DTK2404 = "rehearsal-dtk2404-torch210-py311"
ROCM = "rehearsal-rocm64-gfx942-torch280-py311"
# DTK 24.04 first: the smallest, and the one the breaks use (their module runs before).
CELLS = (DTK2404, K100, BW, ROCM)


@dataclass
class Built:
    """One rehearsal cell's images and what making them took."""

    cell: str
    project: Path
    records: dict[str, dict[str, object]]  # variant -> build record
    build_output: str
    costs: dict[str, float] = field(default_factory=dict)

    def image(self, variant: str) -> str:
        return str(self.records[variant]["image_id"])

    def tag(self, variant: str) -> str:
        tags = self.records[variant]["tags"]
        assert isinstance(tags, list)
        return str(tags[0])


class RehearsalBuilds:
    """Builds each rehearsal cell the first time a test asks, in the session's checkout."""

    def __init__(self, project: Path) -> None:
        self.project = project
        self.built: dict[str, Built] = {}
        self.costs: dict[str, dict[str, float]] = {}

    def get(self, cell: str) -> Built:
        if cell not in self.built:
            self.built[cell] = self._build(cell)
        return self.built[cell]

    def _step(self, costs: dict[str, float], name: str, *args: str) -> str:
        """Run one CLI step, timed; its stdout."""
        started = time.monotonic()
        done = stackpin_cli(*args, cwd=self.project)
        costs[f"{name}_s"] = round(time.monotonic() - started, 1)
        assert done.returncode == 0, f"stackpin {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def _build(self, cell: str) -> Built:
        costs: dict[str, float] = {"disk_free_before_gib": _free_gib()}
        made = json.loads(self._step(costs, "make", "rehearsal", "make", cell, "--json"))
        # The committed pins are what the recipe makes here too: same sources, same bytes.
        assert made["changed"] == [], made
        fetched = json.loads(self._step(costs, "fetch", "wheels", "fetch", cell, "--json"))
        assert fetched["mode"] == "locked", "the committed lock must be current: never resolved in CI"
        output = self._step(costs, "build", "build", cell, "--variant", "all", "--no-normalize",
                            "--builder", "buildkit")
        records = {}
        for path in sorted((self.project / "build" / "records").glob(f"{cell}-*.json")):
            record = json.loads(path.read_text())
            records[str(record["variant"])] = record
            costs[f"image_{record['variant']}_gib"] = round(int(record["image_size"]) / 2**30, 2)
        costs["disk_free_after_gib"] = _free_gib()
        self.costs[cell] = costs
        return Built(cell=cell, project=self.project, records=records, build_output=output,
                     costs=costs)

    def drop(self, cell: str) -> None:
        """Remove the cell's images and what its builds left dangling (rehearsal-labelled:
        only this tier makes those), so the next cell has the disk."""
        built = self.built.pop(cell, None)
        if built is None:
            return
        for record in built.records.values():
            subprocess.run(["docker", "image", "rm", "-f", *record["tags"]],  # type: ignore[misc]
                           capture_output=True, check=False)
        subprocess.run(["docker", "image", "prune", "-f", "--filter",
                        f"label=io.stackpin.cell={cell}"], capture_output=True, check=False)
        subprocess.run(["docker", "image", "prune", "-f", "--filter",
                        "label=io.stackpin.rehearsal"], capture_output=True, check=False)
        shutil.rmtree(self.project / "build" / "context", ignore_errors=True)
        if os.environ.get("CI") == "true":
            # A CI machine gives the default engine's BuildKit cache back at once (about 5 GB
            # a cell; four cells kept it to the end of the run, 19 GB of its disk peak). All
            # of it goes, the CPU cell's too: the tests after this tier build with BuildKit
            # only the sites cell, from no earlier cache. Elsewhere it is kept for the next run.
            subprocess.run(["docker", "builder", "prune", "--all", "--force"],
                           capture_output=True, check=False)
        self.costs[cell]["disk_free_after_drop_gib"] = _free_gib()


def _free_gib() -> float:
    usage = shutil.disk_usage("/var/lib/docker" if Path("/var/lib/docker").exists() else "/")
    return round(usage.free / 2**30, 1)
