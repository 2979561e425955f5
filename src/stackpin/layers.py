"""The image's install layers, lowest first: which locked wheel goes into which layer.

The lock groups wheels by what they are to the vendor boundary (vendor, stack, attention);
the layers split the stack once more, by what changes: its wheels with compiled code
(numpy, pyarrow, tokenizers, ...: large, slow to move) install below its pure-Python
wheels (transformers, peft, trl, unsloth, ...: the pins a release bumps). A layer's diff
ID is a function of its files, and the layers below a change keep their chain IDs, so
after a pure-Python pin change an image update (a delta bundle, a registry push, an
engine's cache) carries the pure layer and what sits above it, not the compiled stack
(issue 25). The rule reads the wheel file name only: the lock and its digest are the same.

Each layer is compiled to bytecode in its own step (templates/compile.py), so no layer
carries another's ``.pyc`` files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from packaging.tags import parse_tag

from stackpin.lock import Group, Lock, LockedWheel
from stackpin.matrix import Cell, Variant

LayerName = Literal["vendor", "stack", "pure", "attention"]
LAYERS: tuple[LayerName, ...] = ("vendor", "stack", "pure", "attention")

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
        "Layer 3: the stack's pure-Python wheels (py3-none-any), every one locked by sha256.",
        "Changing one of these pins rebuilds from here; every layer below keeps its digest.",
    ),
    "attention": (
        "Layer 4: FlashAttention (enhanced variant only), --no-deps.",
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
    """A wheel with no compiled code: every tag's ABI is ``none`` and platform ``any``.

    The tags are the file name's last three fields (the wheel spec's rule); the lock has
    checked the whole name already."""
    fields = filename.removesuffix(".whl").rsplit("-", 3)
    tags = parse_tag("-".join(fields[1:])) if len(fields) == 4 else frozenset()
    return bool(tags) and all(t.abi == "none" and t.platform == "any" for t in tags)


def layer_of(wheel: LockedWheel) -> LayerName:
    """The layer a locked wheel installs in; only the stack group is split."""
    if wheel.group == "stack":
        return "pure" if is_pure(wheel.filename) else "stack"
    if wheel.group == "base":
        msg = f"{wheel.name} is provided by the base image: it installs in no layer"
        raise ValueError(msg)
    return wheel.group


def _group_of(layer: LayerName) -> Group:
    return "stack" if layer == "pure" else layer


def install_layers(cell: Cell, variant: Variant, lock: Lock | None) -> tuple[InstallLayer, ...]:
    """The variant's layers in install order, each with its wheels.

    Without a lock (a render to read, which a build refuses) every layer the variant has is
    shown, empty; with one, the pure layer is left out when the stack has no pure wheel."""
    layers = []
    for name in LAYERS:
        if name == "attention" and not cell.uses_attention(variant):
            continue
        if lock is None:
            layers.append(InstallLayer(name=name, wheels=()))
            continue
        wheels = tuple(w for w in lock.group(_group_of(name)) if layer_of(w) == name)
        if wheels or name != "pure":
            layers.append(InstallLayer(name=name, wheels=wheels))
    return tuple(layers)
