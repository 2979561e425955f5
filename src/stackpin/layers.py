"""The image's install layers, lowest first: which locked wheel goes into which layer.

The lock groups wheels by what they are to the vendor boundary (vendor, stack, attention);
the layers split the stack by how often it moves, lowest the least:
  - ``stack``: wheels with compiled code (numpy, pyarrow, tokenizers, ...: large, slow);
  - ``pure``: the pure-Python wheels nobody pins by name (sympy, networkx, httpx, ...),
    pulled in by the pins and held at their locked versions by ``stackpin lock``;
  - ``pinned``: the pure-Python wheels the cell pins by name (unsloth, transformers, peft,
    trl, ...): what a release engineer bumps.
A layer's diff ID is a function of its files, and the layers below a change keep their
chain IDs, so after one pinned pin changes an image update (a delta bundle, a registry
push, an engine's cache) carries the pinned layer and what sits above it (issue 25). The
rule reads wheel file names and the cell's pins only: the lock and its digest are the same.

Each layer is compiled to bytecode in its own step (templates/compile.py), so no layer
carries another's ``.pyc`` files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packaging.utils import canonicalize_name

from stackpin.abi import parse_wheel_filename
from stackpin.lock import Group, Lock, LockedWheel
from stackpin.matrix import Cell, Variant

LayerName = Literal["vendor", "stack", "pure", "pinned", "attention"]
LAYERS: tuple[LayerName, ...] = ("vendor", "stack", "pure", "pinned", "attention")

# Each layer's comment in the Dockerfile: what it holds and why it sits where it does.
LAYER_TEXT: dict[LayerName, tuple[str, str]] = {
    "vendor": (
        "Layer 1: ABI-bound wheels (torch and vendor builds), --no-deps.",
        "--no-deps so pip can never replace the vendor torch with a generic one from an index.",
    ),
    "stack": (
        "Layer 2: the stack's wheels with compiled code, every one locked by sha256.",
        "Below the pure-Python wheels: these change least of the stack.",
    ),
    "pure": (
        "Layer 3: the pure-Python wheels the pins pull in (py3-none-any), locked by sha256.",
        "`stackpin lock` holds their versions when a pin changes, so this layer stays.",
    ),
    "pinned": (
        "Layer 4: the pure-Python wheels the cell pins by name, locked by sha256.",
        "What a release bumps: one of these pins rebuilds from here, every layer below stays.",
    ),
    "attention": (
        "Layer 5: FlashAttention (enhanced variant only), --no-deps.",
        "Last, so the stable and enhanced images share every layer before it.",
    ),
}


@dataclass(frozen=True, kw_only=True)
class InstallLayer:
    name: LayerName
    wheels: tuple[LockedWheel, ...]

    @property
    def title(self) -> str:
        return LAYER_TEXT[self.name][0]

    @property
    def why(self) -> str:
        return LAYER_TEXT[self.name][1]


def is_pure(filename: str) -> bool:
    """A wheel with no compiled code: every tag's ABI is ``none`` and platform ``any``."""
    return all(t.abi == "none" and t.platform == "any" for t in parse_wheel_filename(filename).tags)


def layer_of(wheel: LockedWheel, pinned: frozenset[str]) -> LayerName:
    """The layer a locked wheel installs in (``pinned``: the cell's stack pins, canonical
    names); only the stack group is split."""
    if wheel.group == "stack":
        if not is_pure(wheel.filename):
            return "stack"
        return "pinned" if canonicalize_name(wheel.name) in pinned else "pure"
    if wheel.group == "base":
        msg = f"{wheel.name} is provided by the base image: it installs in no layer"
        raise ValueError(msg)
    return wheel.group


def _group_of(layer: LayerName) -> Group:
    groups: dict[LayerName, Group] = {"vendor": "vendor", "stack": "stack", "pure": "stack",
                                      "pinned": "stack", "attention": "attention"}
    return groups[layer]


def stack_pins(cell: Cell) -> frozenset[str]:
    """The distributions the cell pins by name in its stack (canonical names)."""
    return frozenset(str(canonicalize_name(name)) for name in cell.stack)


def install_layers(cell: Cell, variant: Variant, lock: Lock | None) -> tuple[InstallLayer, ...]:
    """The variant's layers in install order, each with its wheels.

    Without a lock (a render to read, which a build refuses) every layer the variant has is
    shown, empty; with one, a stack layer without wheels is left out."""
    pinned = stack_pins(cell)
    layers = []
    for name in LAYERS:
        if name == "attention" and not cell.uses_attention(variant):
            continue
        if lock is None:
            layers.append(InstallLayer(name=name, wheels=()))
            continue
        wheels = tuple(w for w in lock.group(_group_of(name)) if layer_of(w, pinned) == name)
        if wheels or _group_of(name) != "stack":
            layers.append(InstallLayer(name=name, wheels=wheels))
    return tuple(layers)
