"""Batched, left-padded greedy generation as a server runs it (issue 22): the prompts of a
batch padded on the left to one length, an attention mask and position ids from it, one
prefill and then one token per step against the KV cache. The same prompts run alone
(no padding, no mask) must give the same tokens: a kernel that mishandles the padding
mask, left padding or the positions changes the batched answers only."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch


def left_padded(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, position ids), each [B, longest], padding first. A
    row's first real token is position 0; its padding sits at 0 too (masked anyway)."""
    width = max(len(p) for p in prompts)
    rows = [(width - len(p), list(p)) for p in prompts]
    ids = [[pad_id] * pad + p for pad, p in rows]
    mask = [[0] * pad + [1] * len(p) for pad, p in rows]
    positions = [[0] * pad + list(range(len(p))) for pad, p in rows]
    on_device = functools.partial(torch.tensor, device=device)
    return on_device(ids), on_device(mask), on_device(positions)


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
    ids, mask, positions = left_padded(prompts, pad_id, device)
    chosen: list[torch.Tensor] = []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        for step in range(steps):
            token = out.logits[:, -1:].argmax(-1)  # [B, 1]: the next input as it is
            chosen.append(token)
            if step == steps - 1:
                break  # the last token needs no forward pass of its own
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    return [_until(row, eos_id) for row in torch.cat(chosen, dim=1).tolist()]


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
    run = functools.partial(
        greedy, model, steps=steps, pad_id=pad_id, device=device, eos_id=eos_id
    )
    batch = run(prompts)
    alone = [run([p])[0] for p in prompts]
    metrics: dict[str, Any] = {
        "prompts": len(prompts),
        "prompt_lengths": [len(p) for p in prompts],
        "steps": steps,
        "same": sum(list(b) == list(a) for b, a in zip(batch, alone, strict=True)),
    }
    return metrics, judge_batched(labels, batch, alone)
