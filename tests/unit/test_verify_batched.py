"""Batched greedy generation's own steps, pinned call by call through a recording model:
the left padding, the mask and the positions of the prefill and of every decode step, the
KV cache handed on, one forward pass per token and none after the last, the device every
input is on (the GPU too where one is visible), and the cut at EOS. L5 and L6 compare a
batch with each prompt alone, which cannot see a fault both sides share (a position off by
one everywhere, a mask one column too wide): these tests can."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import verify_helpers

from stackpin_verify import batched

VOCAB = 101
DEVICES = verify_helpers.run_devices()


def next_token(last: int) -> int:
    """The recording model's choice: a function of the row's last input token only, so a
    prompt gives the same tokens batched or alone."""
    return (3 * last + 1) % VOCAB


class Recorder:
    """A causal LM's call surface, on whatever device its inputs are on."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *, input_ids, attention_mask, position_ids, use_cache, past_key_values=None):
        self.calls.append({
            "ids": input_ids.tolist(),
            "mask": attention_mask.tolist(),
            "positions": position_ids.tolist(),
            "past": past_key_values,
            "use_cache": use_cache,
            "devices": {t.device for t in (input_ids, attention_mask, position_ids)},
        })
        rows, width = input_ids.shape
        logits = torch.zeros(rows, width, VOCAB, device=input_ids.device)
        for row, last in enumerate(input_ids[:, -1].tolist()):
            logits[row, -1, next_token(last)] = 1.0
            logits[row, :-1, 0] = 2.0  # earlier positions point elsewhere: only the last counts
        return SimpleNamespace(logits=logits, past_key_values=("cache", len(self.calls)))


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_prefill_and_each_decode_step_get_the_left_padded_inputs(device):
    model = Recorder()
    got = batched.greedy(model, [[5, 6, 7], [8]], 3, pad_id=0, device=device)
    first = [next_token(7), next_token(8)]  # 22, 25
    second = [next_token(t) for t in first]
    third = [next_token(t) for t in second]
    assert got == [[first[0], second[0], third[0]], [first[1], second[1], third[1]]]
    assert [c["ids"] for c in model.calls] == [
        [[5, 6, 7], [0, 0, 8]],
        [[first[0]], [first[1]]],
        [[second[0]], [second[1]]],
    ]
    assert [c["mask"] for c in model.calls] == [
        [[1, 1, 1], [0, 0, 1]],
        [[1, 1, 1, 1], [0, 0, 1, 1]],
        [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]],
    ]
    assert [c["positions"] for c in model.calls] == [
        [[0, 1, 2], [0, 0, 0]],
        [[3], [1]],
        [[4], [2]],
    ]
    assert [c["past"] for c in model.calls] == [None, ("cache", 1), ("cache", 2)]
    assert all(c["use_cache"] for c in model.calls)
    assert {d.type for c in model.calls for d in c["devices"]} == {device.type}


def test_one_step_is_one_forward_pass():
    model = Recorder()
    assert batched.greedy(model, [[4]], 1, pad_id=0, device=torch.device("cpu")) == [[13]]
    assert len(model.calls) == 1


def test_each_row_is_cut_before_its_first_eos():
    model = Recorder()
    eos = next_token(next_token(7))
    got = batched.greedy(model, [[7], [9]], 3, pad_id=0, device=torch.device("cpu"), eos_id=eos)
    assert got == [[next_token(7)], [next_token(9), next_token(next_token(9)),
                                      next_token(next_token(next_token(9)))]]


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_compare_runs_the_batch_and_then_each_prompt_alone_on_the_device(device):
    model = Recorder()
    metrics, reason = batched.compare(
        model, [[5, 6], [9]], ["a", "b"], 2, pad_id=0, device=device
    )
    assert reason is None
    assert metrics == {"prompts": 2, "prompt_lengths": [2, 1], "steps": 2, "same": 2}
    assert [c["ids"] for c in model.calls[::2]] == [[[5, 6], [0, 9]], [[5, 6]], [[9]]]
    assert {d.type for c in model.calls for d in c["devices"]} == {device.type}


def test_compare_names_a_prompt_whose_batched_answer_differs():
    class PaddingLeaks(Recorder):
        """A model whose answer depends on the padding it should not see."""

        def __call__(self, **kwargs):
            out = super().__call__(**kwargs)
            if (kwargs["attention_mask"] == 0).any():
                out.logits[:, -1] = torch.roll(out.logits[:, -1], 1, dims=-1)
            return out

    metrics, reason = batched.compare(
        PaddingLeaks(), [[5, 6], [9]], ["a", "b"], 1, pad_id=0, device=torch.device("cpu")
    )
    assert metrics["same"] == 0
    assert reason == (
        "2 of 2 prompts answer differently in a left-padded batch than alone: "
        f"'a': batched [{next_token(6) + 1}], alone [{next_token(6)}]; "
        f"'b': batched [{next_token(9) + 1}], alone [{next_token(9)}]"
    )
