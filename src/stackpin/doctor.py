"""`stackpin doctor`: what the engine is, and the combinations that cannot work (pure).

The report joins the daemon's answer (``EngineReport``) with the client side: whether the
docker CLI has the buildx plugin (the BuildKit client stackpin's bake file is built with).
"""

from __future__ import annotations

from dataclasses import dataclass

from stackpin.engine.builders import select_builder
from stackpin.engine.types import EngineReport

GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class Diagnosis:
    report: EngineReport
    buildx: str  # the buildx plugin's version, "" when the docker CLI has none
    # Bytes free where the daemon keeps its data, when that folder is on this host (None:
    # a remote daemon or a VM's). A full disk there fails builds at whatever step is running.
    disk_free: int | None = None

    @property
    def builder(self) -> str:
        """The builder `stackpin build --builder auto` uses here."""
        return select_builder("auto", report=self.report, buildx=self.buildx).builder

    @property
    def timestamps(self) -> str:
        """How a build's timestamps become reproducible: by the engine, or normalised."""
        choice = select_builder("auto", report=self.report, buildx=self.buildx)
        return "native" if choice.native_timestamps else "normalised"

    def problems(self) -> list[str]:
        """One line for each combination that cannot work, saying how to fix it."""
        found = []
        options = " ".join(self.report.security_options)
        store = self.report.version.store
        if "name=userns" in options and store == "containerd":
            found.append(
                "userns-remap is on with the containerd image store, which does not support "
                "it: turn one off in daemon.json (\"userns-remap\" or "
                "features.containerd-snapshotter)"
            )
        if "runc" not in self.report.runtimes:
            found.append("the daemon lists no runc runtime: install runc and restart dockerd")
        major = self.report.version.version.split(".")[0]
        if major.isdigit() and int(major) < 20:
            found.append(
                f"Docker {self.report.version.version} is older than 20.10, the oldest engine "
                "stackpin is tested on: upgrade the engine"
            )
        return found

    def to_json(self) -> dict[str, object]:
        version = self.report.version
        return {
            "engine": version.version, "api_version": version.api_version,
            "os": version.os, "arch": version.arch, "store": version.store,
            "builder": self.builder, "timestamps": self.timestamps,
            "buildkit": self.report.buildkit, "buildx": self.buildx,
            "cgroup_version": self.report.cgroup_version,
            "cgroup_driver": self.report.cgroup_driver,
            "runtimes": list(self.report.runtimes),
            "default_runtime": self.report.default_runtime,
            "security_options": list(self.report.security_options),
            "root_dir": self.report.root_dir, "disk_free_bytes": self.disk_free,
            "problems": self.problems(),
        }

    def lines(self) -> list[str]:
        data = self.to_json()
        keys = ("engine", "api_version", "store", "builder", "timestamps", "buildkit", "buildx",
                "cgroup_version", "cgroup_driver", "runtimes", "default_runtime")
        rows = []
        for key in keys:
            value = data[key]
            shown = ", ".join(value) if isinstance(value, list) else str(value or "-")
            rows.append(f"{key.replace('_', ' ')}: {shown}")
        rows.append(f"disk free: {self._disk_line()}")
        return rows

    def _disk_line(self) -> str:
        where = self.report.root_dir or "the daemon's data folder"
        if self.disk_free is None:
            return f"- ({where} is not on this host)"
        return f"{self.disk_free / GIB:.1f} GiB at {where}"
