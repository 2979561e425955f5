"""FlashAttention checks' plumbing (layouts, varlen packing, GQA) on CPU.

No flash_attn wheel runs on this host, so an SDPA-backed module with flash_attn's call
signatures stands in for it; the point is that the check feeds it correctly laid-out
inputs, compares with the right reference, and catches a kernel that gets varlen wrong.
"""

from __future__ import annotations

import functools
import importlib.machinery
import itertools
import sys
import types

import pytest
import torch
import verify_helpers

from stackpin_verify import level3
from stackpin_verify.attention import sdpa
from stackpin_verify.checks import run_check


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    return sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal).transpose(
        1, 2
    )


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
    bounds = cu_q.tolist()
    pieces = [
        _dense(q[a:b][None], k[a:b][None], v[a:b][None], causal=causal)[0]
        for a, b in itertools.pairwise(bounds)
    ]
    return torch.cat(pieces)


def _varlen_ignoring_boundaries(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
    # A kernel that attends across packed sequences: the classic varlen bug.
    return _dense(q[None], k[None], v[None], causal=causal)[0]


def _install(monkeypatch: pytest.MonkeyPatch, varlen: object) -> None:
    module = types.ModuleType("flash_attn")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    module.__version__ = "sdpa-stand-in"
    module.flash_attn_func = _dense
    module.flash_attn_varlen_func = varlen
    monkeypatch.setitem(sys.modules, "flash_attn", module)


@pytest.mark.parametrize(
    ("kind", "dim", "causal"),
    [("dense", 64, True), ("varlen", 128, False), ("gqa", 64, True), ("varlen", 64, True)],
)
def test_flash_cases_pass_with_a_correct_kernel(monkeypatch, kind, dim, causal):
    _install(monkeypatch, _varlen)
    ctx = verify_helpers.cpu_context()
    name = f"L3.flash.{kind}.hd{dim}.{level3._causal(causal)}"
    result = run_check(
        name, functools.partial(level3.check_flash_case, ctx, kind, dim=dim, causal=causal)
    )
    assert result.status == "pass", result.reason
    assert result.metrics["max_scaled_diff"] <= result.metrics["tolerance"]
    heads_kv = 2 if kind == "gqa" else 8
    assert result.metrics["shape_kv"][-2:] == [heads_kv, dim]


def test_varlen_kernel_attending_across_sequences_fails(monkeypatch):
    _install(monkeypatch, _varlen_ignoring_boundaries)
    ctx = verify_helpers.cpu_context()
    fn = functools.partial(level3.check_flash_case, ctx, "varlen", dim=64, causal=False)
    result = run_check("L3.flash.varlen.hd64.noncausal", fn)
    assert result.status == "fail"
    assert result.reason.startswith("out max_abs_diff")
    assert result.metrics["seqlens"] == [256, 131]


def test_kernel_exception_names_the_shape(monkeypatch):
    def broken(*args: object, **kwargs: object) -> torch.Tensor:
        msg = "FlashAttention only supports head dimension at most 256"
        raise RuntimeError(msg)

    _install(monkeypatch, _varlen)
    monkeypatch.setattr(sys.modules["flash_attn"], "flash_attn_func", broken)
    ctx = verify_helpers.cpu_context()
    fn = functools.partial(level3.check_flash_case, ctx, "gqa", dim=128, causal=True)
    result = run_check("L3.flash.gqa.hd128.causal", fn)
    assert result.status == "fail"
    assert result.reason == (
        "FlashAttention failed for q[2, 256, 8, 128] kv[2, 256, 2, 128] bf16 causal gqa: "
        "RuntimeError: FlashAttention only supports head dimension at most 256"
    )


def test_flash_image_without_an_accelerator_fails_the_import_gate():
    ctx = verify_helpers.cpu_context(verify_helpers.image_info(attention="flash_attn"))
    results = level3.run_flash(ctx)
    gate = results[0]
    assert (gate.name, gate.status) == ("L3.flash.import", "fail")
    assert gate.reason == (
        "no accelerator: FlashAttention runs on GPUs only, but the image's attention is flash_attn"
    )
    assert len(results) == 14  # gate, 12 cases, speedup
    assert all(r.status == "skip" for r in results[1:])
    assert results[1].reason.startswith("L3.flash.import did not pass: no accelerator")


def test_sdpa_image_without_flash_attn_skips_flash():
    ctx = verify_helpers.cpu_context(verify_helpers.image_info())
    if level3.flash_wanted(ctx):
        pytest.skip("flash_attn is installed here")
    [result] = level3.run_flash(ctx)
    assert (result.name, result.status) == ("L3.flash", "skip")
