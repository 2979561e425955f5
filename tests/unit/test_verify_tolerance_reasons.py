"""Each tolerance or scale of verify/ held to the reason its comment gives, so that twice or
half the value fails a test (scripts/mutate_constants.py mutates them; the GPU-visible run
of 2026-12-02 found these standing on nothing but the honest runs' margin):

- the range cases' values case keeps the scaled logits of order 1 (the softmax spread,
  neither uniform nor one-hot) while q sits far above fp16's range and v near the top of
  the dtype's;
- the range cases' logits case puts the logits near the top of fp32's and of what fp16's
  explicit QK^T holds, and beyond fp16's range for bf16;
- the GEMM bound's LAMBDA is Higham and Mary's, at a false-alarm rate per element under
  1e-7 (3e-8 at 6);
- L2's softmax tolerance catches a kernel that rounds its exponentials or its outputs to
  fp16, faults an honest fp32 kernel is far from.

"Near the top" is measured in the exponent: the largest magnitude reaches three quarters
of the way up the dtype's binary exponent range (2^96 of fp32's and bf16's 2^128, 2^12 of
fp16's 2^16)."""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch
import verify_helpers

from stackpin_verify import attention_range, gemm_shapes, level1, level2
from stackpin_verify.checks import run_check
from stackpin_verify.context import DTYPES, tiny_work_threads

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    with tiny_work_threads(CPU):
        yield


def _top_exponent(dtype_name: str) -> float:
    return math.log2(torch.finfo(DTYPES[dtype_name]).max)


def _near_the_top(value: float, dtype_name: str) -> bool:
    return math.log2(value) >= 0.75 * _top_exponent(dtype_name)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_values_case_keeps_the_logits_of_order_one_with_v_near_the_top(dtype):
    q, k, v = attention_range.range_inputs(dtype, "values", CPU)
    logit = attention_range.max_logit(q.double(), k.double())
    assert 2.0 <= logit <= 32.0, logit  # softmax spread: neither uniform nor one-hot
    assert _near_the_top(float(v.abs().max()), dtype)
    assert float(v.abs().max()) < torch.finfo(DTYPES[dtype]).max


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_values_case_puts_q_far_above_fp16s_range(dtype):
    q, _, _ = attention_range.range_inputs(dtype, "values", CPU)
    assert float(q.abs().max()) > 2.0**32  # fp16 tops out at 65,504 (2^16)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_logits_case_reaches_near_the_top(dtype):
    q, k, _ = attention_range.range_inputs(dtype, "logits", CPU)
    logit = attention_range.max_logit(q.double(), k.double())
    products = float((q.double() @ k.double().mT).abs().max())  # fp16's explicit QK^T
    assert _near_the_top(logit, dtype), logit
    assert products < torch.finfo(DTYPES[dtype]).max


def test_logits_case_goes_beyond_fp16s_range_for_bf16():
    q, k, _ = attention_range.range_inputs("bf16", "logits", CPU)
    assert attention_range.max_logit(q.double(), k.double()) > torch.finfo(torch.float16).max


def test_gemm_bound_false_alarms_are_under_one_in_ten_million_elements():
    per_element = 2 * math.exp(-(gemm_shapes.LAMBDA**2) / 2)
    assert per_element < 1e-7
    assert 2 * math.exp(-((gemm_shapes.LAMBDA - 1) ** 2) / 2) > 1e-7  # not looser than needed


def _softmax_check(monkeypatch, softmax) -> object:
    monkeypatch.setattr(level2, "_kernels", lambda ctx: SimpleNamespace(softmax=softmax))
    ctx = verify_helpers.cpu_context()
    return run_check("L2.triton.softmax", functools.partial(level2.check_softmax, ctx))


def test_an_honest_fp32_softmax_passes(monkeypatch):
    result = _softmax_check(monkeypatch, lambda x: torch.softmax(x, dim=-1))
    assert result.status == "pass", result.reason


def _exp_in_fp16(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp((x - x.amax(-1, keepdim=True)).half()).float()
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    "fault",
    [_exp_in_fp16, lambda x: torch.softmax(x, dim=-1).half().float()],
    ids=["exp in fp16", "outputs stored as fp16"],
)
def test_a_softmax_narrowed_to_fp16_inside_fails(monkeypatch, fault):
    result = _softmax_check(monkeypatch, fault)
    assert result.status == "fail"
    assert result.reason.startswith("differs from torch.softmax by ")


def _gemm(monkeypatch, dtype: str, *, inputs=None, output=None):
    """L1's square GEMM, its inputs or its output rounded through a narrower type."""
    if inputs is not None or output is not None:
        real = torch.Tensor.__matmul__

        def through(a, b):
            if a.dtype == torch.float64:  # the float64 reference stays honest
                return real(a, b)
            if inputs is not None:
                a, b = a.to(inputs).to(a.dtype), b.to(inputs).to(b.dtype)
            out = real(a, b)
            return out.to(output).to(out.dtype) if output is not None else out

        monkeypatch.setattr(torch.Tensor, "__matmul__", through)
    ctx = verify_helpers.cpu_context()
    return run_check(f"L1.gemm.{dtype}", functools.partial(level1.check_gemm, ctx, dtype))


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_an_honest_gemm_passes_with_room(dtype):
    result = _gemm(None, dtype)
    assert result.status == "pass", result.reason
    assert result.metrics["rel_err"] < result.metrics["tolerance"] / 3


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_gemm_whose_output_passes_through_bf16_fails(monkeypatch, dtype):
    """About 5 u of the wider type (2.2e-3 here): under the old fp16 tolerance of 4e-3 it
    passed, and it would again at twice the tolerance."""
    result = _gemm(monkeypatch, dtype, output=torch.bfloat16)
    assert result.status == "fail"
    assert result.reason.startswith("relative error ")


def test_fp32_at_tf32s_precision_passes(monkeypatch):
    """TF32 rounds the inputs to fp16's 10 explicit mantissa bits and accumulates in fp32:
    what torch lets an fp32 matmul do on an accelerator."""
    result = _gemm(monkeypatch, "fp32", inputs=torch.float16)
    assert result.status == "pass", result.reason
