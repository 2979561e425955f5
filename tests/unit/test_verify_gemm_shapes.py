"""Issue 22's L1 shapes: edges off every tile, a long K, a batched product, each judged
element by element by the rounding bound of float32 accumulation (gemm_shapes.py)."""

from __future__ import annotations

import functools

import pytest
import torch
import verify_helpers

from stackpin_verify import gemm_shapes, level1
from stackpin_verify.checks import CheckResult, run_check

CTX = verify_helpers.cpu_context()
CPU = torch.device("cpu")


def _never(dtype: str) -> str | None:
    return None


def _results() -> dict[str, CheckResult]:
    return {r.name: r for r in level1.run(CTX)}


def test_shapes_are_off_every_tile_with_a_long_k_and_a_batch():
    for case in ("edges", "batched"):
        _, m, k, n = gemm_shapes.CPU_SHAPES[case]
        assert all(x % 8 for x in (m, k, n))
        _, m, k, n = gemm_shapes.GPU_SHAPES[case]
        assert all(x % 8 for x in (m, k, n))
    assert gemm_shapes.CPU_SHAPES["large_k"][2] >= 16384
    assert gemm_shapes.CPU_SHAPES["batched"][0] > 1
    assert gemm_shapes.GPU_SHAPES["large_k"][2] >= 65536


def test_honest_products_pass_every_shape_and_dtype():
    results = _results()
    names = [f"L1.gemm.{d}.{c}" for d in ("fp32", "fp16", "bf16") for c in gemm_shapes.CPU_SHAPES]
    for name in names:
        assert results[name].status == "pass", (name, results[name].reason)
        assert results[name].metrics["worst_ratio"] <= 1.0
    assert results["L1.gemm.bf16.batched"].metrics["shape"] == [5, 97, 65, 113]


def test_narrow_accumulator_fails_the_long_k_while_the_square_k256_check_passes(monkeypatch):
    verify_helpers.apply_fault(monkeypatch, "matmul_fp16_accumulate")
    results = _results()
    for dtype in ("fp16", "bf16"):
        failed = results[f"L1.gemm.{dtype}.large_k"]
        assert failed.status == "fail"
        assert "accumulation narrower than float32 or a wrong product" in failed.reason
        assert failed.metrics["worst_ratio"] > 4
        # The old criterion does not see it: why the long K exists.
        assert results[f"L1.gemm.{dtype}"].status == "pass", results[f"L1.gemm.{dtype}"].reason
    assert results["L1.gemm.fp32.large_k"].status == "pass"


def test_a_product_wrong_at_one_edge_element_fails_the_edges_case():
    def last_row_off(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(a, b)
        out[-1, -1] += 0.05 * out.abs().max()
        return out

    check = functools.partial(
        gemm_shapes.check_shape, CTX, "fp32", "edges", _never, matmul=last_row_off
    )
    result = run_check("L1.gemm.fp32.edges", check)
    assert result.status == "fail"
    assert result.reason.startswith("error ")
    assert " at [256, 66] is " in result.reason


def test_bound_is_output_rounding_plus_accumulation_and_nothing_more():
    a = torch.ones(1, 4, dtype=torch.float64)
    b = torch.ones(4, 1, dtype=torch.float64)
    bound = gemm_shapes.Bound(u_out=2.0**-8, u_acc=2.0**-24, reduction=0.0)
    allowed = 2.0**-8 * 4 + gemm_shapes.LAMBDA * 2 * 2.0**-24 * 4
    ok = torch.tensor([[4 + allowed * 0.999]])
    assert gemm_shapes.judge_product(ok, a, b, bound)[1] is None
    wrong = torch.tensor([[4 + allowed * 1.001]])
    metrics, reason = gemm_shapes.judge_product(wrong, a, b, bound)
    assert reason is not None and metrics["worst_ratio"] == pytest.approx(1.001, rel=1e-4)
    nan = torch.tensor([[float("nan")]])
    assert gemm_shapes.judge_product(nan, a, b, bound)[1] == "1 non-finite values in the product"


def test_cpu_bound_is_the_dtypes_unit_roundoff_and_float32_accumulation():
    bound = gemm_shapes.bound_for(torch.bfloat16, CPU)
    assert (bound.u_out, bound.u_acc, bound.reduction) == (2.0**-8, 2.0**-24, 0.0)
    assert gemm_shapes.bound_for(torch.float16, CPU).u_out == 2.0**-11
    assert gemm_shapes.bound_for(torch.float32, CPU).u_out == 2.0**-24


def test_unsupported_dtype_skips_with_the_reason():
    check = functools.partial(gemm_shapes.check_shape, CTX, "fp16", "edges", lambda d: "no fp16")
    result = run_check("L1.gemm.fp16.edges", check)
    assert (result.status, result.reason) == ("skip", "no fp16")


def test_unravel_gives_the_coordinates_of_a_flat_index():
    assert gemm_shapes.unravel(0, (2, 3)) == [0, 0]
    assert gemm_shapes.unravel(5, (2, 3)) == [1, 2]
    assert gemm_shapes.unravel(7, (2, 3, 4)) == [0, 1, 3]


def test_gpu_bound_follows_what_torch_lets_the_kernel_do():
    """TF32 for float32 when torch's matmul precision allows it, and split-K reductions in
    the input dtype when cuBLAS may use them: each widens the bound only on the GPU (the
    flags are torch's; a CPU build holds them too, so the branch runs here)."""
    cuda = torch.device("cuda")
    matmul = torch.backends.cuda.matmul
    precision = torch.get_float32_matmul_precision()
    flags = (matmul.allow_fp16_reduced_precision_reduction,
             matmul.allow_bf16_reduced_precision_reduction)
    try:
        torch.set_float32_matmul_precision("highest")
        assert gemm_shapes.bound_for(torch.float32, cuda).u_acc == 2.0**-24
        torch.set_float32_matmul_precision("high")
        assert gemm_shapes.bound_for(torch.float32, cuda).u_acc == 2.0**-11
        assert gemm_shapes.bound_for(torch.float32, CPU).u_acc == 2.0**-24
        for allowed in (False, True):
            matmul.allow_fp16_reduced_precision_reduction = allowed
            matmul.allow_bf16_reduced_precision_reduction = allowed
            for dtype, u in ((torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)):
                bound = gemm_shapes.bound_for(dtype, cuda)
                assert (bound.u_out, bound.u_acc) == (u, 2.0**-24)
                assert bound.reduction == (gemm_shapes.REDUCTION_ROUNDINGS * u if allowed else 0)
                assert gemm_shapes.bound_for(dtype, CPU).reduction == 0
            assert gemm_shapes.bound_for(torch.float32, cuda).reduction == 0
    finally:
        torch.set_float32_matmul_precision(precision)
        (matmul.allow_fp16_reduced_precision_reduction,
         matmul.allow_bf16_reduced_precision_reduction) = flags


def test_operands_are_seeded_in_the_dtype_on_the_device_asked():
    meta = torch.device("meta")
    a, b = gemm_shapes.operands((3, 5, 7, 2), torch.bfloat16, meta)
    assert (a.shape, b.shape) == ((3, 5, 7), (3, 7, 2))
    assert {a.device, b.device} == {meta} and {a.dtype, b.dtype} == {torch.bfloat16}
    a2, b2 = gemm_shapes.operands((0, 5, 7, 2), torch.float32, CPU)
    assert (a2.shape, b2.shape) == ((5, 7), (7, 2))
    again = gemm_shapes.operands((0, 5, 7, 2), torch.float32, CPU)
    assert torch.equal(a2, again[0]) and torch.equal(b2, again[1]) and not torch.equal(a2[0], b2[:, 0])


# --- what the GPU-visible mutation run left unpinned (docs/evidence/mutation-h200) ----------

EXACT = gemm_shapes.Bound(u_out=0.5, u_acc=0.0, reduction=0.0)


def test_k_is_the_inner_dimension_of_a_batched_product():
    a, b = torch.ones(2, 3, 5, dtype=torch.float64), torch.ones(2, 5, 4, dtype=torch.float64)
    metrics, reason = gemm_shapes.judge_product(a @ b, a, b, gemm_shapes.bound_for(
        torch.float64, CPU))
    assert reason is None
    assert metrics == {"k": 5, "worst_ratio": 0.0,
                       "bound": gemm_shapes.bound_for(torch.float64, CPU).to_json()}


def test_an_error_exactly_at_the_bound_passes_and_a_hair_over_fails():
    a, b = torch.tensor([[2.0]]), torch.tensor([[1.0]])  # c = 2: allowed 0.5 * 2 = 1
    metrics, reason = gemm_shapes.judge_product(torch.tensor([[3.0]]), a, b, EXACT)
    assert reason is None and metrics["worst_ratio"] == 1.0
    _, reason = gemm_shapes.judge_product(torch.tensor([[3.0001]]), a, b, EXACT)
    assert reason is not None and reason.startswith("error 1 at [0, 0] is 1x the bound")
    # Under the bound on the other side too: the error is |c - c64|, not c + c64.
    assert gemm_shapes.judge_product(torch.tensor([[1.0]]), a, b, EXACT)[1] is None


def test_each_term_of_the_bound_counts_as_written():
    a = torch.tensor([[3.0, -3.0]], dtype=torch.float64)  # c = 0, |A||B| = 6
    b = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    # The accumulation term alone: 6 sqrt(2) u_acc 6.
    acc = gemm_shapes.Bound(u_out=0.0, u_acc=2.0**-10, reduction=0.0)
    allowed = gemm_shapes.LAMBDA * 2**0.5 * 2.0**-10 * 6
    assert gemm_shapes.judge_product(torch.tensor([[allowed * 0.99]]), a, b, acc)[1] is None
    assert gemm_shapes.judge_product(torch.tensor([[allowed * 1.01]]), a, b, acc)[1] is not None
    # The reduction term scales with max|c64| (here 40), and adds to the others.
    a2 = torch.tensor([[40.0], [0.0]], dtype=torch.float64)
    b2 = torch.tensor([[1.0]], dtype=torch.float64)
    red = gemm_shapes.Bound(u_out=0.0, u_acc=0.0, reduction=0.1)  # 0.1 * 40 = 4
    assert gemm_shapes.judge_product(torch.tensor([[40.0], [3.9]]), a2, b2, red)[1] is None
    assert gemm_shapes.judge_product(torch.tensor([[40.0], [4.1]]), a2, b2, red)[1] is not None


def test_non_finite_products_are_counted_by_name():
    a = b = torch.ones(1, 1)
    assert gemm_shapes.judge_product(torch.tensor([[float("inf")]]), a, b, EXACT) == (
        {"nonfinite": 1}, "1 non-finite values in the product")


def test_operands_are_the_seeded_draws_on_the_device_asked_for():
    gen = torch.Generator().manual_seed(4321)
    a = torch.randn(2, 3, 4, generator=gen).to(torch.bfloat16)
    b = torch.randn(2, 4, 5, generator=gen).to(torch.bfloat16)
    got = gemm_shapes.operands((2, 3, 4, 5), torch.bfloat16, CPU)
    assert torch.equal(got[0], a) and torch.equal(got[1], b)
    meta = gemm_shapes.operands((0, 3, 4, 5), torch.float16, torch.device("meta"))
    assert [t.device.type for t in meta] == ["meta", "meta"]
    assert [tuple(t.shape) for t in meta] == [(3, 4), (4, 5)]


def test_an_accelerator_gets_the_accelerator_shapes(monkeypatch):
    accelerated = verify_helpers.cpu_context()
    monkeypatch.setattr(type(accelerated), "accelerated", property(lambda self: True))
    seen = []

    def matmul(a, b):  # records the operands; the product itself is exact
        seen.append((tuple(a.shape), tuple(b.shape)))
        return (a.double() @ b.double()).to(a.dtype)

    small = {"edges": (0, 9, 7, 5)}
    monkeypatch.setattr(gemm_shapes, "GPU_SHAPES", small)
    metrics = gemm_shapes.check_shape(accelerated, "fp32", "edges", _never, matmul)
    assert seen == [((9, 7), (7, 5))] and metrics["shape"] == [0, 9, 7, 5]


def test_a_product_that_should_be_zero_and_is_not_fails_even_with_no_room():
    zero = gemm_shapes.Bound(u_out=0.0, u_acc=0.0, reduction=0.0)
    a = b = torch.zeros(1, 1, dtype=torch.float64)
    assert gemm_shapes.judge_product(torch.zeros(1, 1), a, b, zero)[1] is None
    _, reason = gemm_shapes.judge_product(torch.full((1, 1), 1e-300, dtype=torch.float64),
                                          a, b, zero)
    assert reason is not None  # the floor of the bound is +tiny, never below zero
