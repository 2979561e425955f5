"""The workload stable versus enhanced is judged on, declared as data (workload.json beside
this module): the attention shapes Unsloth Studio trains and serves at by default, and the
model the LoRA step is timed on. One home for both L3.variants.attention and
L5.variants.train_step, so neither can be tuned to a shape that flatters one side.

Every shape is causal: the cells serve decoder language models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DECLARATION = Path(__file__).with_name("workload.json")
USES = ("train", "serve")
MODES = {"train": "fwd_bwd", "serve": "fwd"}


@dataclass(frozen=True)
class AttentionShape:
    use: str  # "train" | "serve"
    batch: int
    seqlen: int
    heads: int
    head_dim: int
    mode: str  # "fwd_bwd" for train, "fwd" for serve
    why: str


@cache
def declared() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DECLARATION.read_text(encoding="utf-8"))
    return data


def attention_shapes(data: dict[str, Any] | None = None) -> list[AttentionShape]:
    """The declared shapes, each checked: a use and its mode, positive sizes."""
    data = declared() if data is None else data
    heads = int(data["heads"])
    found = []
    for entry in data["shapes"]:
        shape = AttentionShape(use=str(entry["use"]), batch=int(entry["batch"]),
                               seqlen=int(entry["seqlen"]), heads=heads,
                               head_dim=int(entry["head_dim"]), mode=str(entry["mode"]),
                               why=str(entry["why"]))
        if shape.use not in USES or shape.mode != MODES[shape.use]:
            msg = f"workload shape {entry}: use must be train (fwd_bwd) or serve (fwd)"
            raise ValueError(msg)
        if min(shape.batch, shape.seqlen, shape.head_dim, heads) < 1:
            msg = f"workload shape {entry}: sizes must be positive"
            raise ValueError(msg)
        found.append(shape)
    return found


def train_shape(data: dict[str, Any] | None = None) -> AttentionShape:
    """The first train shape: the batch a LoRA step is timed on."""
    return next(s for s in attention_shapes(data) if s.use == "train")
