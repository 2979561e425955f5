"""The padded-batch criterion's own parts, each pinned where the end-to-end cases cannot
see it: the MHA and pre-2.5 GQA paths of ``sdpa_masked`` (the cases run grouped-query heads
on a current torch), the device every piece lands on (``meta`` stands in for a GPU on any
host; the whole check runs on the GPU too where one is visible), the bias every run draws
alike and exactly in every dtype, the mask's dtype as the kernel receives it, and what a
skip or a failure says."""

from __future__ import annotations

import pytest
import torch
import verify_helpers

from stackpin_verify import level3, masked
from stackpin_verify.context import DTYPES as DTYPE_OF
from stackpin_verify.context import tiny_work_threads

META = torch.device("meta")
CASE = masked.MaskCase("fp32", "left", "additive", causal=True)


@pytest.fixture(autouse=True)
def _one_thread():
    with tiny_work_threads(torch.device("cpu")):
        yield


_padded = verify_helpers.padded_case


def _qkv(heads_q: int, heads_kv: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, heads_q, 5, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, heads_kv, 5, 4, generator=gen, dtype=torch.float64) for _ in "kv")
    return q, k, v


def _left_padded_mask() -> tuple[torch.Tensor, torch.Tensor]:
    valid = masked.key_valid([5, 3], 5, "left", torch.device("cpu"))
    allowed = masked.padded_mask(valid, causal=True)
    bias = masked.exact_bias(allowed.shape, torch.float64, torch.device("cpu"))
    return allowed, masked.additive(allowed, bias)


@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("form", ["bool", "additive"])
def test_sdpa_masked_is_the_explicit_attention_with_that_mask(heads, form):
    q, k, v = _qkv(*heads)
    allowed, additive = _left_padded_mask()
    mask = allowed if form == "bool" else additive
    bias = additive if form == "additive" else masked.additive(allowed, torch.zeros_like(additive))
    got = masked.sdpa_masked(q, k, v, mask)
    want = masked.masked_math(q, k, v, causal=False, bias=bias)
    torch.testing.assert_close(got, want)


def _spy_sdpa(monkeypatch) -> list[dict]:
    real = torch.nn.functional.scaled_dot_product_attention
    calls: list[dict] = []

    def spy(q, k, v, **kwargs):
        calls.append({"heads": (q.shape[1], k.shape[1]), **kwargs})
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(masked.F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize(
    ("release", "native"), [((2, 4), False), ((2, 5), True), ((2, 13), True), ((3, 0), True)]
)
def test_grouped_heads_use_sdpas_own_gqa_from_torch_2_5_and_repeat_kv_before(
    monkeypatch, release, native
):
    calls = _spy_sdpa(monkeypatch)
    monkeypatch.setattr(masked, "torch_release", lambda: release)
    q, k, v = _qkv(4, 2)
    _, additive = _left_padded_mask()
    got = masked.sdpa_masked(q, k, v, additive)
    torch.testing.assert_close(got, masked.masked_math(q, k, v, causal=False, bias=additive))
    (call,) = calls
    assert call.get("enable_gqa", False) is native
    assert call["heads"] == ((4, 2) if native else (4, 4))


def test_equal_heads_never_ask_for_gqa(monkeypatch):
    calls = _spy_sdpa(monkeypatch)
    q, k, v = _qkv(4, 4)
    masked.sdpa_masked(q, k, v, _left_padded_mask()[0])
    assert [c.get("enable_gqa") for c in calls] == [None]


def test_every_piece_of_the_batch_lands_on_the_runs_device():
    # "meta" is a device every host has: a piece left on the CPU shows here as on a GPU.
    valid = masked.key_valid([3, 1], 3, "left", META)
    packed = torch.empty(4, 2, 8, device=META)
    pieces = {
        "key_valid": valid,
        "padded_mask causal": masked.padded_mask(valid, causal=True),
        "padded_mask full": masked.padded_mask(valid, causal=False),
        "pad_batch": masked.pad_batch(packed, [3, 1], "left"),
        "exact_bias": masked.exact_bias((2, 1, 3, 3), torch.bfloat16, META),
    }
    assert {name: t.device.type for name, t in pieces.items()} == dict.fromkeys(pieces, "meta")
    assert masked.pad_batch(packed, [3, 1], "right").shape == (2, 3, 2, 8)


def test_pad_batch_puts_each_sequence_where_its_padding_is_not():
    packed = torch.arange(1.0, 5.0).reshape(4, 1, 1)  # sequences [1, 2, 3] and [4]
    left = masked.pad_batch(packed, [3, 1], "left")[..., 0, 0].tolist()
    right = masked.pad_batch(packed, [3, 1], "right")[..., 0, 0].tolist()
    fill = masked.PAD_FILL
    assert left == [[1.0, 2.0, 3.0], [fill, fill, 4.0]]
    assert right == [[1.0, 2.0, 3.0], [4.0, fill, fill]]


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_the_bias_is_the_same_draw_every_run_and_exact_in_every_dtype(dtype):
    shape = (3, 1, 113, 113)
    bias = masked.exact_bias(shape, DTYPE_OF[dtype], torch.device("cpu"))
    again = masked.exact_bias(shape, DTYPE_OF[dtype], torch.device("cpu"))
    wide = masked.exact_bias(shape, torch.float64, torch.device("cpu"))
    assert bias.dtype == DTYPE_OF[dtype] and tuple(bias.shape) == shape
    assert torch.equal(bias, again)
    assert torch.equal(bias.double(), wide)  # nothing rounded away in the dtype
    assert torch.equal(wide * 8, (wide * 8).round())
    assert wide.min().item() == -2.0 and wide.max().item() == 2.0
    assert len(wide.unique()) == 33  # real-valued, not a boolean in disguise


@pytest.mark.parametrize("case", masked.mask_cases(["fp16", "bf16", "fp32"])[:8:2]
                         + masked.mask_cases(["bf16"])[1::2], ids=lambda c: c.name)
def test_the_kernel_receives_an_additive_mask_in_the_queries_dtype(monkeypatch, case):
    """As transformers hands SDPA its mask; a float32 mask beside bf16 queries is another
    kernel path than the one a server runs."""
    seen: list[torch.dtype] = []
    real = masked.sdpa_masked

    def spy(q, k, v, mask):
        seen.append(mask.dtype)
        return real(q, k, v, mask)

    monkeypatch.setattr(masked, "sdpa_masked", spy)
    assert _padded(case).status == "pass"
    want = torch.bool if case.form == "bool" else DTYPE_OF[case.dtype]
    assert seen and set(seen) == {want}


def test_a_dtype_the_device_lacks_skips_the_case_saying_why(monkeypatch):
    monkeypatch.setattr(level3, "sdpa_unsupported", lambda dtype, device: f"no {dtype} here")
    result = _padded(CASE)
    assert (result.status, result.reason) == ("skip", "no fp32 here")


def test_a_kernel_that_raises_fails_the_case_by_its_name_quoting_the_error(monkeypatch):
    def broken(*args, **kwargs):
        msg = "no kernel image"
        raise RuntimeError(msg)

    monkeypatch.setattr(masked.F, "scaled_dot_product_attention", broken)
    result = _padded(CASE)
    assert result.status == "fail"
    assert result.reason.startswith(f"SDPA ({CASE.name}) failed: RuntimeError: no kernel image")


def test_a_failed_case_keeps_the_numbers_it_failed_by(monkeypatch):
    verify_helpers.apply_fault(monkeypatch, "sdpa_mask_ignored")
    result = _padded(CASE)
    assert result.status == "fail"
    assert result.metrics["error_ratio"] > 1.0
    assert result.reason.startswith("out error ")


def test_the_same_case_reports_the_same_numbers_run_after_run():
    first, second = _padded(CASE), _padded(CASE)
    assert first.status == second.status == "pass"
    numbers = {k: v for k, v in first.metrics.items() if k != "seconds"}
    assert numbers == {k: v for k, v in second.metrics.items() if k != "seconds"}
