"""One build session of a cell, shared by `stackpin build` and `stackpin rebuild`.

Both verbs do the same before their first image: resolve the cell's targets and refuse
bad input before Docker works (``prepare``: matrix rules, pinned hashes, a current and
complete lock, a wheelhouse identical to it, the provenance labels), then, on the engine
they are given, make the base present and choose the builder (``start``). Each variant is
then planned against the session. The engine is an argument: the CLI passes the daemon's,
the unit tests the shared fake.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stackpin import __version__, rehearsal_base
from stackpin.bootstrap import ensure_base
from stackpin.build import BuildPlan, LineSink, plan, preflight, vet_cell
from stackpin.bundle.source import load_bundled_base, recorded_commit
from stackpin.cache import cache_dir
from stackpin.engine import Engine
from stackpin.engine.builders import BuilderChoice, select_builder
from stackpin.target import (
    LABEL_SOURCE_COMMIT,
    LABEL_VERSION,
    OCI_REVISION,
    Layout,
    Target,
    resolve,
)


def source_commit(root: Path) -> str:
    """HEAD of the checkout, '+dirty' when tracked files differ; outside git, the commit a
    bundle folder records (SOURCE_COMMIT), else 'unknown'."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        # A --with-wheels bundle is a project without git: it records its images' commit.
        return recorded_commit(root) or "unknown"
    return f"{head}+dirty" if dirty else head


def provenance_labels(root: Path) -> dict[str, str]:
    commit = source_commit(root)
    return {OCI_REVISION: commit, LABEL_SOURCE_COMMIT: commit, LABEL_VERSION: __version__}


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A cell's targets once every check that needs no engine has passed."""

    layout: Layout
    targets: tuple[Target, ...]
    provenance: Mapping[str, str]


def prepare(layout: Layout, cell_id: str, variant: str) -> Prepared:
    """Resolve the targets and refuse, before Docker does any work, what cannot build."""
    targets = resolve(layout, cell_id, variant, vet=vet_cell)
    preflight(targets[0])
    return Prepared(layout=layout, targets=tuple(targets),
                    provenance=provenance_labels(layout.root))


@dataclass(frozen=True, kw_only=True)
class Session:
    """A prepared cell on an engine: its base present, its builder chosen."""

    prepared: Prepared
    engine: Engine
    base_id: str
    builder: BuilderChoice

    def plan(self, target: Target, *, no_cache: bool) -> BuildPlan:
        return plan(target, no_cache=no_cache, provenance=dict(self.prepared.provenance),
                    builder=self.builder)


def start(engine: Engine, prepared: Prepared, *, requested_builder: str, buildx: str,
          base_tar: Path | None = None, offline: bool = False,
          on_line: LineSink) -> Session:
    """The base present (loaded from a --with-wheels bundle when offline, from a tar,
    pulled or bootstrapped) and the builder this engine and the docker CLI give."""
    cell = prepared.targets[0].cell
    if offline:
        load_bundled_base(engine, cell, prepared.layout.root, on_line=on_line)
    base = ensure_base(engine, cell, cache_dir=cache_dir(), base_tar=base_tar, on_line=on_line,
                       rehearsal_base=rehearsal_base.ensure)
    choice = select_builder(requested_builder, report=engine.report(), buildx=buildx)
    return Session(prepared=prepared, engine=engine, base_id=base.image_id, builder=choice)
