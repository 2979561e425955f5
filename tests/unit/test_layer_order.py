"""Layer order keeps the lower layers stable across locks (issue 25, delta bundles).

A delta bundle ships the layers whose chain IDs a site lacks; after one change of a pin the
cell names (peft, transformers, unsloth, ...: what releases bump) that must be the pinned
layer and what sits above it, never the base, the venv, torch, the compiled stack or the
unpinned pure-Python wheels (stackpin.layers). Normalised builds make a layer's diff ID a
function of its files (test_reproducible), and the files of a step are a function of its
Dockerfile instruction and the context files it reads; each step compiles only its own
bytecode (test_compile_layer), and `stackpin lock` holds the unpinned versions
(test_lock_keeps). So: across two locks that differ in one pin, every instruction up to the
pinned install, and every context file those read, must be byte-identical; the pinned
layer's requirements must differ. (The classic builder's final stage copies the whole
environment as one layer, so only BuildKit images get smaller deltas.)
"""

from __future__ import annotations

import dataclasses

from tests.conftest import ROOT

from stackpin.context import read_sources
from stackpin.lock import Lock, read_lock
from stackpin.matrixfile import load_cells
from stackpin.render import RenderRequest, render

CPU_CELL = "cpu-bookworm-torch2130-py311"


def _changed_stack_pin(lock: Lock) -> Lock:
    """The lock with one stack wheel at another version (as a re-lock after a pin bump)."""
    wheels = list(lock.wheels)
    index = next(i for i, w in enumerate(wheels) if w.name == "peft" and w.group == "stack")
    wheels[index] = dataclasses.replace(
        wheels[index], version="0.20.0", filename="peft-0.20.0-py3-none-any.whl",
        sha256="0" * 64)
    return dataclasses.replace(lock, wheels=tuple(wheels))


def _steps_below(layer: str, dockerfile: str) -> list[str]:
    """The instructions before a layer's install (comments build nothing)."""
    steps = [line for line in dockerfile.splitlines() if line and not line.startswith("#")]
    first = next(i for i, line in enumerate(steps) if f"wheels/{layer}," in line)
    return steps[:first]


def test_one_pure_stack_pin_changes_nothing_below_the_pure_layer():
    cell = load_cells(sorted((ROOT / "pinning").glob("*.toml")))[CPU_CELL]
    lock = read_lock(ROOT, CPU_CELL)
    assert lock is not None
    renders = [render(RenderRequest(cell=cell, variant="stable", lock=each,
                                    sources=read_sources(ROOT / "templates"), stackpin_version="0",
                                    builder="buildkit"))
               for each in (lock, _changed_stack_pin(lock))]
    old, new = (r.files for r in renders)
    below = _steps_below("pinned", old["Dockerfile"])
    assert below == _steps_below("pinned", new["Dockerfile"])
    assert any("wheels/vendor," in step for step in below), "torch installs below the stack"
    assert any("wheels/stack," in step for step in below), "the compiled stack too"
    assert any("wheels/pure," in step for step in below), "and the unpinned pure wheels"
    for layer in ("vendor", "stack", "pure"):
        assert old[f"wheels/{layer}/requirements.txt"] == new[f"wheels/{layer}/requirements.txt"]
    assert old["wheels/pinned/requirements.txt"] != new["wheels/pinned/requirements.txt"]
    # What the steps below read from the context: their wheels' folders and the tools.
    read = {word.split("=", 1)[1].split(",")[0] for step in below for word in step.split()
            if word.startswith("source=")}
    assert read <= {"wheels/vendor", "wheels/stack", "wheels/pure", "tools",
                    "/opt/stackpin-tools"}, read
    assert old["tools/compile.py"] == new["tools/compile.py"]
    # A COPY below the stack (none today) must copy context files no lock changes.
    copied = [step.split()[1] for step in below
              if step.startswith("COPY ") and not step.split()[1].startswith("--from")]
    for source in copied:
        files = {name for name in old if name.startswith(source.rstrip("/"))}
        assert all(old[name] == new.get(name) for name in files), source
