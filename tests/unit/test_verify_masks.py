"""Issue 22's L3 criteria: a padded batch against each sequence alone, uneven varlen with
its own cu_seqlens_k and bottom-right causal alignment, attention at the top of each
dtype's range. Each fault is the one tests/faults/sitecustomize.py injects in a real run."""

from __future__ import annotations

import functools
import importlib.machinery
import itertools
import sys
import types

import pytest
import torch
import verify_helpers

from stackpin_verify import attention_range, level3, masked
from stackpin_verify.attention import sdpa
from stackpin_verify.checks import CheckFailed, CheckResult, run_check
from stackpin_verify.context import DTYPES as DTYPE_OF
from stackpin_verify.context import tiny_work_threads

CTX = verify_helpers.cpu_context()
DTYPES = ("fp16", "bf16", "fp32")
MASK_CASES = masked.mask_cases(DTYPES)


@pytest.fixture(autouse=True)
def _one_thread():
    with tiny_work_threads(torch.device("cpu")):
        yield


_padded = verify_helpers.padded_case


def _range() -> dict[str, CheckResult]:
    results = level3.run_sdpa_edges(CTX)
    return {r.name: r for r in results if ".range." in r.name}


# --- the padded batch ---------------------------------------------------------------------


def test_cases_cover_both_paddings_both_mask_forms_causal_and_not_per_dtype():
    names = {c.name for c in MASK_CASES}
    assert len(names) == 24
    assert "L3.sdpa.bf16.padded.left.additive.causal" in names
    assert "L3.sdpa.fp16.padded.right.bool.noncausal" in names
    assert {r.name for r in level3.run_sdpa_edges(CTX)} >= names


@pytest.mark.parametrize("device", verify_helpers.run_devices(), ids=str)
def test_honest_sdpa_passes_every_padded_case(device):
    """On every device here: the CPU, and the GPU where one is visible (the H200's
    mutation run), where a piece of the batch left on the CPU fails."""
    for case in MASK_CASES:
        result = _padded(case, device)
        assert result.status == "pass", (str(device), case.name, result.reason)
        assert result.metrics["seqlens"] == [113, 59, 38]
        assert result.metrics["error_ratio"] <= 1.0


def test_left_padding_puts_the_padding_first_and_right_padding_last():
    valid = masked.key_valid([3, 1], 3, "left", torch.device("cpu"))
    assert valid.tolist() == [[True, True, True], [False, False, True]]
    valid = masked.key_valid([3, 1], 3, "right", torch.device("cpu"))
    assert valid.tolist() == [[True, True, True], [True, False, False]]


def test_mask_lets_a_real_row_see_real_keys_up_to_itself_and_a_padding_row_everything():
    valid = masked.key_valid([2], 3, "left", torch.device("cpu"))
    causal = masked.padded_mask(valid, causal=True)[0, 0].tolist()
    assert causal == [[True, True, True], [False, True, False], [False, True, True]]
    full = masked.padded_mask(valid, causal=False)[0, 0].tolist()
    assert full == [[True, True, True], [False, True, True], [False, True, True]]


def test_additive_mask_is_the_bias_where_allowed_and_minus_infinity_elsewhere():
    allowed = torch.tensor([[True, False]])
    mask = masked.additive(allowed, torch.tensor([[0.5, 0.25]], dtype=torch.bfloat16))
    assert mask.dtype == torch.bfloat16
    assert mask.tolist() == [[0.5, float("-inf")]]


@pytest.mark.parametrize("case", MASK_CASES[::2], ids=lambda c: c.name)
def test_kernel_ignoring_the_mask_fails_every_padded_case(monkeypatch, case):
    verify_helpers.apply_fault(monkeypatch, "sdpa_mask_ignored")
    result = _padded(case)
    assert result.status == "fail"
    assert result.reason.startswith("out error ")


def test_mask_read_as_right_padding_fails_every_left_case_and_only_those(monkeypatch):
    verify_helpers.apply_fault(monkeypatch, "sdpa_mask_right_aligned")
    for case in masked.mask_cases(["bf16"]):
        result = _padded(case)
        want = "fail" if case.padding == "left" else "pass"
        assert result.status == want, (case.name, result.reason)
        if want == "fail":
            assert result.reason.startswith("out error ")


def test_additive_mask_read_as_a_boolean_fails_every_additive_case(monkeypatch):
    real = torch.nn.functional.scaled_dot_product_attention

    def as_boolean(q, k, v, attn_mask=None, **kwargs):
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            attn_mask = torch.isfinite(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", as_boolean)
    for case in masked.mask_cases(["fp32"]):
        result = _padded(case)
        assert result.status == ("fail" if case.form == "additive" else "pass"), case.name


def test_padded_reference_is_each_sequence_alone():
    lengths = [3, 2]
    q, k, v = (torch.randn(5, 2, 4, dtype=torch.float64) for _ in range(3))
    packed = masked.per_sequence_reference(lengths, causal=True)(q, k, v)
    second = masked.masked_math(*(t[3:].transpose(0, 1)[None] for t in (q, k, v)), causal=True)
    assert torch.allclose(packed[3:], second[0].transpose(0, 1), atol=1e-12)
    # The first row of each sequence sees only itself.
    assert torch.allclose(packed[3, 0], v[3, 0], atol=1e-12)


# --- uneven varlen, FlashAttention's definition ---------------------------------------------


def _varlen_honest(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
    """flash_attn_varlen_func as flash-attention defines it: each sequence alone, its own
    key span, causal aligned bottom-right (written with the explicit attention)."""
    pieces = []
    for (qa, qb), (ka, kb) in zip(
        itertools.pairwise(cu_q.tolist()), itertools.pairwise(cu_k.tolist()), strict=True
    ):
        one = [t.transpose(0, 1)[None] for t in (q[qa:qb], k[ka:kb], v[ka:kb])]
        pieces.append(masked.masked_math(*one, causal=causal)[0].transpose(0, 1))
    return torch.cat(pieces)


def _flash_module(varlen=_varlen_honest) -> types.ModuleType:
    module = types.ModuleType("flash_attn")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    module.flash_attn_varlen_func = varlen
    module.flash_attn_func = lambda q, k, v, causal=False: sdpa(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal
    ).transpose(1, 2)
    return module


def _varlen_results(module: types.ModuleType) -> dict[str, CheckResult]:
    return {r.name: r for r in masked.run_flash(CTX, ["bf16"], module)}


def test_uneven_varlen_cases_have_their_own_key_lengths_and_a_decode_row():
    assert masked.VARLEN_Q[0] == 1
    assert all(q <= k for q, k in zip(masked.VARLEN_Q, masked.VARLEN_K, strict=True))
    assert any(q < k for q, k in zip(masked.VARLEN_Q, masked.VARLEN_K, strict=True))
    names = [name for name, _, _ in masked.varlen_qk_names(["bf16"])]
    assert names == [
        "L3.flash.bf16.varlen_qk.dense.causal",
        "L3.flash.bf16.varlen_qk.dense.noncausal",
        "L3.flash.bf16.varlen_qk.gqa.causal",
        "L3.flash.bf16.varlen_qk.gqa.noncausal",
    ]


def test_honest_varlen_kernel_passes_uneven_lengths():
    results = _varlen_results(_flash_module())
    assert all(r.status == "pass" for r in results.values()), results
    gqa = results["L3.flash.bf16.varlen_qk.gqa.causal"].metrics
    assert gqa["shape_q"] == [118, 8, 64] and gqa["shape_kv"] == [243, 2, 64]
    assert gqa["seqlens_q"] == [1, 40, 77] and gqa["seqlens_k"] == [113, 40, 90]


def _faulty_module(monkeypatch, fault: str) -> types.ModuleType:
    module = _flash_module()
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    verify_helpers.apply_fault(monkeypatch, fault)
    return module


def test_varlen_reading_keys_with_cu_seqlens_q_fails_every_case(monkeypatch):
    results = _varlen_results(_faulty_module(monkeypatch, "flash_cu_seqlens_k_ignored"))
    assert all(r.status == "fail" for r in results.values())


def test_causal_aligned_top_left_fails_every_causal_case_only(monkeypatch):
    results = _varlen_results(_faulty_module(monkeypatch, "flash_causal_top_left"))
    for name, result in results.items():
        assert result.status == ("fail" if name.endswith(".causal") else "pass"), name


def _keyword_varlen_module() -> types.ModuleType:
    """A stand-in shaped like FlashAttention 4: ``qv`` fourth, so the offsets come only by
    keyword (the suite calls every package that way, through flashpkg)."""

    def varlen(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
               max_seqlen_k=None, causal=False):
        assert qv is None, "the offsets were handed over as qv"
        return _varlen_honest(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              causal=causal), None

    module = _flash_module(varlen=varlen)
    return module


def _through_flashpkg(monkeypatch, fault: str | None) -> dict[str, CheckResult]:
    """As a real run calls it: sitecustomize patches the package at start-up, then the
    suite loads it through flashpkg, which passes the offsets by keyword."""
    from stackpin_verify import flashpkg

    monkeypatch.setitem(sys.modules, "flash_attn", _keyword_varlen_module())
    if fault:
        verify_helpers.apply_fault(monkeypatch, fault)
    return _varlen_results(flashpkg.load("flash_attn"))


def test_varlen_faults_fail_by_their_numbers_when_called_by_keyword(monkeypatch):
    """A fault wrapper taking the offsets only by position made every case fail with its
    own TypeError on the device, which proved nothing about the criterion."""
    honest = _through_flashpkg(monkeypatch, None)
    assert all(r.status == "pass" for r in honest.values()), honest
    with monkeypatch.context() as m:
        ignored = _through_flashpkg(m, "flash_cu_seqlens_k_ignored")
    assert all(r.status == "fail" for r in ignored.values())
    assert not any("TypeError" in r.reason for r in ignored.values()), ignored
    with monkeypatch.context() as m:
        top_left = _through_flashpkg(m, "flash_causal_top_left")
    for name, result in top_left.items():
        assert result.status == ("fail" if name.endswith(".causal") else "pass"), name
        assert "Error" not in (result.reason or ""), result.reason


def test_sdpas_own_causal_flag_is_top_left_so_the_reference_is_written_out():
    # torch's is_causal on a 1 x 3 score matrix lets the one query see only key 0; the
    # bottom-right definition lets it see all three. A stand-in built on it must fail.
    def top_left(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
        pieces = []
        for (qa, qb), (ka, kb) in zip(
            itertools.pairwise(cu_q.tolist()), itertools.pairwise(cu_k.tolist()), strict=True
        ):
            one = [t.transpose(0, 1)[None] for t in (q[qa:qb], k[ka:kb], v[ka:kb])]
            out = torch.nn.functional.scaled_dot_product_attention(*one, is_causal=causal)
            pieces.append(out[0].transpose(0, 1))
        return torch.cat(pieces)

    results = _varlen_results(_flash_module(varlen=top_left))
    assert results["L3.flash.bf16.varlen_qk.dense.causal"].status == "fail"
    assert results["L3.flash.bf16.varlen_qk.dense.noncausal"].status == "pass"


def test_varlen_cases_skip_naming_the_gate_without_flash():
    results = masked.run_flash(CTX, ["bf16"], None)
    assert [r.status for r in results] == ["skip"] * 4
    assert results[0].reason == "L3.flash.import did not pass"


# --- the top of each dtype's range -----------------------------------------------------------


def test_range_inputs_reach_past_fp16_for_bf16_and_near_the_top_for_fp16():
    q, _, v = attention_range.range_inputs("bf16", "values", torch.device("cpu"))
    assert float(q.abs().max()) > 65504 and float(v.abs().max()) > 1e36
    q, k, _ = attention_range.range_inputs("bf16", "logits", torch.device("cpu"))
    logits = (q.double() @ k.double().transpose(-2, -1)).abs().max() / 8
    assert float(logits) > 65504
    _, _, v = attention_range.range_inputs("fp16", "values", torch.device("cpu"))
    assert 16384 < float(v.abs().max()) < 65504


def test_honest_sdpa_passes_every_range_case():
    results = _range()
    assert sorted(results) == sorted(
        f"L3.sdpa.{d}.range.{c}" for d in DTYPES for c in ("values", "logits")
    )
    for name, result in results.items():
        assert result.status == "pass", (name, result.reason)


def test_kernel_narrowing_bf16_to_fp16_fails_the_bf16_range_by_name(monkeypatch):
    verify_helpers.apply_fault(monkeypatch, "sdpa_narrow_bf16")
    results = _range()
    failed = sorted(name for name, r in results.items() if r.status == "fail")
    assert "L3.sdpa.bf16.range.values" in failed
    assert all(".bf16." in name for name in failed)
    reason = results["L3.sdpa.bf16.range.values"].reason
    assert reason.startswith("values near the top of the bf16 range: ")
    assert "outputs are not finite (inf or NaN)" in reason
    # The unit-variance case does not see it: why the range case exists.
    case = level3.Case("sdpa", "bf16", "dense", 113, 64, True)
    unit = run_check(case.name, functools.partial(level3.check_sdpa, CTX, case))
    assert unit.status == "pass", unit.reason


def test_finite_outputs_that_are_wrong_still_fail_the_bound():
    inputs = attention_range.range_inputs("fp32", "values", torch.device("cpu"))

    def off(q, k, v):
        return sdpa(q, k, v, causal=False) * 1.01

    metrics, reason = attention_range.compare_forward(off, inputs)
    assert reason is not None and reason.startswith("out error ")
    assert metrics["max_abs_v"] > 1e36


def test_non_finite_output_is_counted():
    out = torch.tensor([1.0, float("inf"), float("nan")])
    assert attention_range.judge_finite(out) == "2 of 3 outputs are not finite (inf or NaN)"
    assert attention_range.judge_finite(torch.ones(2)) is None


def test_flash_range_runs_flash_attn_func_on_bshd():
    calls = []

    def dense(q, k, v, causal=False):
        calls.append((tuple(q.shape), causal))
        return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal).transpose(
            1, 2
        )

    fn = attention_range.flash_bhsd(dense)
    results = attention_range.run(CTX, "flash", ["bf16"], fn, lambda dtype: None)
    assert [r.status for r in results] == ["pass", "pass"]
    assert calls[0] == ((2, 113, 4, 64), False)


# --- what mutation testing found unpinned (docs/verification.md) ---------------------------


class _Reached(Exception):
    pass


def _recording_module(seen: dict) -> types.ModuleType:
    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
        seen.update(q=(q.device, q.dtype, tuple(q.shape)), k=(k.device, k.dtype, tuple(k.shape)),
                    cu_q=(cu_q.device, cu_q.dtype), cu_k=(cu_k.device, cu_k.dtype),
                    max_q=max_q, max_k=max_k, causal=causal)
        raise _Reached

    return _flash_module(varlen=varlen)


def test_uneven_varlen_inputs_and_offsets_live_on_the_runs_device(monkeypatch):
    """On CPU every tensor left to the default device is where the inputs are anyway; the
    meta device stands in for the accelerator, where a CPU offsets tensor reaches the kernel."""
    from stackpin_verify import capability

    asked: list[tuple[str, torch.device]] = []
    monkeypatch.setattr(capability, "unsupported",
                        lambda name, device, probe: asked.append((name, device)))
    meta = torch.device("meta")
    ctx = verify_helpers.cpu_context()
    ctx.device = meta
    seen: dict = {}
    with pytest.raises(CheckFailed, match="FlashAttention varlen failed: _Reached"):
        masked.check_varlen_qk(ctx, _recording_module(seen), "bf16", causal=True, gqa=True)
    assert asked == [("bf16", meta)]
    assert seen == {
        "q": (meta, torch.bfloat16, (sum(masked.VARLEN_Q), 8, 64)),
        "k": (meta, torch.bfloat16, (sum(masked.VARLEN_K), 2, 64)),
        "cu_q": (meta, torch.int32), "cu_k": (meta, torch.int32),
        "max_q": max(masked.VARLEN_Q), "max_k": max(masked.VARLEN_K), "causal": True,
    }


def test_uneven_varlen_skips_where_the_dtype_is_unsupported_saying_why(monkeypatch):
    from stackpin_verify import capability

    monkeypatch.setattr(capability, "unsupported",
                        lambda name, device, probe: f"no {name} on this device")
    results = _varlen_results(_recording_module({}))
    assert {r.status for r in results.values()} == {"skip"}
    assert {r.reason for r in results.values()} == {"no bf16 on this device"}


def test_range_cases_skip_where_the_dtype_is_unsupported_saying_why():
    results = attention_range.run(CTX, "sdpa", ["bf16"], sdpa, lambda dtype: f"no {dtype} here")
    assert [(r.status, r.reason) for r in results] == [("skip", "no bf16 here")] * 2


def test_range_inputs_live_on_the_runs_device():
    seen: list[tuple[torch.device, torch.dtype]] = []

    def recording(q, k, v):
        seen.append((q.device, q.dtype))
        raise _Reached

    ctx = verify_helpers.cpu_context()
    ctx.device = torch.device("meta")
    results = attention_range.run(ctx, "sdpa", ["bf16"], recording, lambda dtype: None)
    assert seen == [(torch.device("meta"), torch.bfloat16)] * 2
    assert results[0].reason == "attention at the top of the bf16 range raised _Reached: "


# --- range: what the GPU-visible mutation run left unpinned (docs/evidence/mutation-h200) ---


@pytest.mark.parametrize(("dtype", "case"), [(d, c) for d in DTYPES for c in ("values", "logits")])
def test_range_inputs_are_the_seeded_draws_at_exactly_the_cases_scales(dtype, case):
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(attention_range.SHAPE, generator=gen, dtype=torch.float64)
               for _ in range(3))
    if case == "values":
        eq, ek, ev = attention_range.VALUE_SCALES[dtype]
        q, k, v = q * 2.0**eq, k * 2.0**ek, v * 2.0**ev
    else:
        half = 2.0 ** (attention_range.LOGIT_SCALES[dtype] / 2)
        q, k = q * half, k * half
    want = [t.to(DTYPE_OF[dtype]) for t in (q, k, v)]
    got = attention_range.range_inputs(dtype, case, torch.device("cpu"))
    for name, a, b in zip("qkv", got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name


def test_range_inputs_land_on_the_device_asked_for():
    # "meta" is a device every host has: an input left on the CPU shows here as on a GPU.
    got = attention_range.range_inputs("bf16", "values", torch.device("meta"))
    assert [t.device.type for t in got] == ["meta"] * 3
    assert [t.dtype for t in got] == [torch.bfloat16] * 3


def test_max_logit_is_the_largest_scaled_logit_on_uneven_shapes():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64)  # B, H, S_q, D
    k = torch.randn(1, 2, 7, 3, generator=gen, dtype=torch.float64)  # S_k != S_q != D != H
    want = max(abs(float(q[0, h, i] @ k[0, h, j])) for h in range(2) for i in range(5)
               for j in range(7)) / 3 ** 0.5
    assert attention_range.max_logit(q, k) == pytest.approx(want, rel=1e-12)


def test_compare_forward_reports_what_it_judged_and_against_what():
    for dtype, wide in (("fp32", "float64"), ("bf16", "float32"), ("fp16", "float32")):
        inputs = attention_range.range_inputs(dtype, "values", torch.device("cpu"))
        metrics, reason = attention_range.compare_forward(
            lambda q, k, v: sdpa(q, k, v, causal=False), inputs)
        assert reason is None
        q, k, v = inputs
        assert metrics["dtype"] == str(q.dtype).removeprefix("torch.")
        assert metrics["reference_dtype"] == wide
        assert metrics["max_abs_q"] == float(q.abs().max())
        assert metrics["max_abs_v"] == float(v.abs().max())
        assert metrics["max_abs_logit"] == attention_range.max_logit(
            q.to(getattr(torch, wide)), k.to(getattr(torch, wide)))
        assert set(metrics["errors"]) == {"out"}
        assert set(metrics["errors"]["out"]) >= {"kernel", "pytorch", "bound"}, metrics["errors"]


def test_a_wrong_shape_is_named_with_both_shapes():
    inputs = attention_range.range_inputs("fp32", "values", torch.device("cpu"))
    metrics, reason = attention_range.compare_forward(lambda q, k, v: v[..., :32], inputs)
    assert reason == "output shape [2, 4, 113, 32] != expected [2, 4, 113, 64]"
    assert "errors" not in metrics


def test_a_failed_range_check_keeps_its_numbers():
    result = attention_range.run(CTX, "sdpa", ["fp32"], lambda q, k, v: q * float("nan"),
                                 lambda dtype: None)[0]
    assert result.status == "fail"
    assert result.metrics["dtype"] == "float32" and result.metrics["max_abs_q"] > 2.0**60
