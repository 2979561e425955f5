"""Batched, left-padded greedy generation as a server runs it (issue 22): the prompts of a
batch padded on the left to one length, an attention mask and position ids from it, one
prefill and then one token per step against the KV cache. The same prompts run alone
(no padding, no mask) must give the same tokens: a kernel that mishandles the padding
mask, left padding or the positions changes the batched answers only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def left_padded(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask), each [B, longest], padding first."""
    width = max(len(p) for p in prompts)
    ids = [[pad_id] * (width - len(p)) + list(p) for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)


def greedy(
    model: Any,
    prompts: Sequence[Sequence[int]],
    steps: int,
    *,
    pad_id: int,
    device: torch.device,
    eos_id: int | None = None,
) -> list[list[int]]:
    """Each prompt's ``steps`` greedy tokens (cut before its first ``eos_id``)."""
    ids, mask = left_padded(prompts, pad_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    found: list[list[int]] = [[] for _ in prompts]
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        for step in range(steps):
            token = out.logits[:, -1].argmax(-1)
            for row, value in zip(found, token.tolist(), strict=True):
                row.append(int(value))
            if step == steps - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    return [_until(row, eos_id) for row in found]


def _until(tokens: list[int], eos_id: int | None) -> list[int]:
    return tokens[: tokens.index(eos_id)] if eos_id is not None and eos_id in tokens else tokens


def judge_batched(
    labels: Sequence[str], batched: Sequence[Sequence[int]], alone: Sequence[Sequence[int]]
) -> str | None:
    """Why the batch's answers differ from the prompts' own, or None."""
    if not labels:
        return "no prompt was generated"
    wrong = [
        f"{label!r}: batched {list(b)}, alone {list(a)}"
        for label, b, a in zip(labels, batched, alone, strict=True)
        if list(b) != list(a)
    ]
    if not wrong:
        return None
    return (
        f"{len(wrong)} of {len(labels)} prompts answer differently in a left-padded batch "
        f"than alone: {'; '.join(wrong[:3])}"
    )


def compare(
    model: Any,
    prompts: Sequence[Sequence[int]],
    labels: Sequence[str],
    steps: int,
    *,
    pad_id: int,
    device: torch.device,
    eos_id: int | None = None,
) -> tuple[dict[str, Any], str | None]:
    """Generate the prompts batched and one by one; (metrics, reason or None)."""
    batch = greedy(model, prompts, steps, pad_id=pad_id, device=device, eos_id=eos_id)
    alone = [
        greedy(model, [p], steps, pad_id=pad_id, device=device, eos_id=eos_id)[0]
        for p in prompts
    ]
    metrics: dict[str, Any] = {
        "prompts": len(prompts),
        "prompt_lengths": [len(p) for p in prompts],
        "steps": steps,
        "same": sum(list(b) == list(a) for b, a in zip(batch, alone, strict=True)),
    }
    return metrics, judge_batched(labels, batch, alone)
