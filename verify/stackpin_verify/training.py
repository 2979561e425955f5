"""Training loop and the judges that catch the field's fine-tuning faults (pure pieces)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from stackpin_verify.tinylm import Batch


@dataclass
class Trace:
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    # Per trainable parameter (model.parameters() order): the optimizer's own step count.
    optimizer_steps: list[int] = field(default_factory=list)


def grad_norm(parameters: list[torch.nn.Parameter]) -> float:
    norms = [p.grad.detach().float().norm() for p in parameters if p.grad is not None]
    if not norms:
        return 0.0
    return float(torch.stack(norms).norm())


def train_steps(model: Any, batch: Batch, *, steps: int, lr: float) -> Trace:
    """Plain AdamW on the trainable parameters; stops at the first non-finite loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    trace = Trace()
    for _ in range(steps):
        loss = model(**batch).loss
        torch.autograd.backward(loss)
        trace.losses.append(float(loss.detach()))
        trace.grad_norms.append(grad_norm(params))
        if not math.isfinite(trace.losses[-1]):
            break
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    trace.optimizer_steps = [_step_count(optimizer.state.get(p, {})) for p in params]
    return trace


def _step_count(state: dict[str, Any]) -> int:
    """Adam's ``step`` (a tensor from torch 1.12, an int before); 0 where never stepped."""
    return int(state.get("step", 0))


def judge_trace(trace: Trace, *, min_drop: float = 0.5) -> str | None:
    """Finite loss and non-zero gradient at every step, and the loss at most ``min_drop``
    of its start at the end (an adapter attached to nothing leaves it flat at ln(vocab))."""
    if not trace.losses:
        return "no training step ran"
    for step, (loss, norm) in enumerate(zip(trace.losses, trace.grad_norms, strict=True)):
        if not math.isfinite(loss):
            return f"loss is not finite ({loss}) at step {step}"
        if not math.isfinite(norm) or norm == 0.0:
            return f"gradient norm is {norm} at step {step}: nothing is learning"
    first, last = trace.losses[0], trace.losses[-1]
    if last > first * min_drop:
        return (
            f"loss fell from {first:.4g} to {last:.4g} in {len(trace.losses)} steps, "
            f"less than the required factor {1 / min_drop:g}"
        )
    return None


def judge_padding(batch: Batch, *, pad_id: int) -> str | None:
    """Padding positions must carry label -100, real tokens their own id; a batch without
    padding would prove nothing."""
    mask = batch["attention_mask"] == 0
    labels, ids = batch["labels"], batch["input_ids"]
    if not bool(mask.any()):
        return "the batch has no padding, so label masking cannot be checked"
    if bool((ids[mask] != pad_id).any()):
        return "positions with attention_mask 0 do not hold the pad token"
    unmasked = int((labels[mask] != -100).sum())
    if unmasked:
        return (
            f"{unmasked} padding positions have labels other than -100: "
            "the loss trains the model to emit padding"
        )
    if bool((labels[~mask] != ids[~mask]).any()):
        return "labels of real tokens differ from their input ids"
    return None


def judge_trainable(actual: int, expected: int) -> str | None:
    if actual == 0:
        return "no parameter is trainable"
    if actual != expected:
        return (
            f"{actual} trainable parameters, expected {expected} from the config: "
            "LoRA attached to other modules than all attention and MLP projections"
        )
    return None
