"""The heavy levels through their pure pieces, plus one real L5+L6 run at its CPU size."""

from __future__ import annotations

import sys

import pytest
import torch
import verify_helpers

from stackpin_verify import level1, level5, level6, level7
from stackpin_verify.attention import compare_attention, make_qkv, math_attention, sdpa
from stackpin_verify.checks import CheckResult

# --- L1 ----------------------------------------------------------------------------------


def test_gemm_judge_accepts_a_correct_product_and_rejects_a_wrong_one():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)
    ref = a.double() @ b.double()
    metrics, reason = level1.judge_gemm(a @ b, ref, level1.TOLERANCE["fp32"])
    assert reason is None
    assert metrics["rel_err"] < 1e-5
    wrong = (a @ b).clone()
    wrong[3, 7] += 5.0
    metrics, reason = level1.judge_gemm(wrong, ref, level1.TOLERANCE["fp32"])
    assert reason is not None
    assert reason.startswith("relative error")
    assert metrics["max_abs_err"] == pytest.approx(5.0, rel=1e-4)


def test_gemm_judge_rejects_non_finite_products():
    out = torch.ones(4, 4)
    out[1, 1] = float("inf")
    out[2, 2] = float("nan")
    metrics, reason = level1.judge_gemm(out, torch.ones(4, 4, dtype=torch.float64), 1e-3)
    assert (metrics, reason) == ({"nonfinite": 2}, "2 non-finite values in the product")


def test_fp32_gemm_check_runs_and_reports_throughput():
    ctx = verify_helpers.cpu_context()
    metrics = level1.check_gemm(ctx, "fp32")
    assert metrics["shape"] == [256, 256, 256]
    assert metrics["runs"] >= 5
    assert metrics["tflops"] == pytest.approx(2 * 256**3 / (metrics["median_ms"] * 1e-3) / 1e12)
    assert metrics["rel_err"] <= metrics["tolerance"]


# --- L3 (GQA reference) ---------------------------------------------------------------------


def test_math_reference_matches_sdpa_with_gqa_in_float64():
    q, k, v = make_qkv(
        [1, 4, 16, 8], [1, 2, 16, 8], dtype=torch.float64, device=torch.device("cpu")
    )
    for causal in (True, False):
        expected = math_attention(q, k, v, causal=causal)
        assert torch.allclose(sdpa(q, k, v, causal=causal), expected, atol=1e-12)


def test_gqa_with_wrong_head_grouping_is_caught():
    """A kernel that pairs query heads with the wrong KV heads (tile instead of repeat)."""

    def tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        return sdpa(q, k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1), causal=False)

    inputs = make_qkv([1, 4, 16, 8], [1, 2, 16, 8], dtype=torch.float32, device=torch.device("cpu"))
    reference = lambda q, k, v: math_attention(q, k, v, causal=False)  # noqa: E731
    metrics, reason = compare_attention(tiled, reference, inputs, tolerance=1e-4)
    assert reason is not None
    assert reason.startswith("out max_abs_diff")
    assert metrics["max_scaled_diff"] > 1e-4


# --- L7 ----------------------------------------------------------------------------------------


def test_launch_uses_the_collective_backend_only_with_two_devices():
    assert level7.choose_launch(0) == ("gloo", 2)
    assert level7.choose_launch(1) == ("gloo", 2)
    assert level7.choose_launch(2) == ("nccl", 2)
    assert level7.choose_launch(8) == ("nccl", 8)
    command = level7.launch_command("gloo", 2, verify_helpers.ROOT / "x.json")
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[command.index("--nproc_per_node") + 1] == "2"
    assert command[command.index("-m", 3) + 1] == "stackpin_verify.ddp_worker"


def test_launch_never_needs_the_hostname():
    # Regression: in a container with --network none the hostname does not resolve and
    # torchrun --standalone failed L7 with "gai error: -3" (seen in `stackpin verify`).
    command = level7.launch_command("gloo", 2, verify_helpers.ROOT / "x.json")
    assert "--standalone" not in command
    assert command[command.index("--master_addr") + 1] == "127.0.0.1"
    assert command[command.index("--local_addr") + 1] == "127.0.0.1"
    assert level7._worker_env()["GLOO_SOCKET_IFNAME"] == "lo"


def test_ddp_judge():
    good = {
        "grad_norm": 0.5,
        "grad_rank_diff": 0.0,
        "grad_vs_mean_diff": 1e-9,
        "weight_rank_diff": 0.0,
    }
    assert level7.judge_ddp(good) is None
    assert level7.judge_ddp({**good, "grad_rank_diff": 0.25}) == (
        "gradients differ across ranks by 0.25 (tolerance 1e-06)"
    )
    assert level7.judge_ddp({**good, "grad_norm": 0.0}) == "DDP gradients are zero"
    assert level7.judge_ddp({**good, "weight_rank_diff": float("nan")}) == (
        "weights differ across ranks after the step by nan (tolerance 1e-06)"
    )


def test_allreduce_judge():
    assert level7.judge_allreduce({"world_size": 2, "expected": 3.0, "max_abs_err": 0.0}) is None
    assert level7.judge_allreduce({"world_size": 2, "expected": 3.0, "max_abs_err": 1.0}) == (
        "all-reduce over 2 ranks is off by 1 (expected every element 3)"
    )


def test_torchrun_timeout_kills_the_process_group():
    code, output = level7.run_torchrun(
        [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
        timeout_s=3,
    )
    assert code == -1
    assert output.startswith("timed out after 3 s")


# --- L5 + L6 end to end, once ------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained() -> tuple[list[CheckResult], list[CheckResult]]:
    pytest.importorskip("peft")
    ctx = verify_helpers.cpu_context()
    return level5.run(ctx), level6.run(ctx)


@pytest.mark.slow
def test_lora_training_memorises_and_generation_reproduces_it(trained):
    l5, l6 = trained
    by_name = {result.name: result for result in l5 + l6}
    required = [r for r in l5 + l6 if r.required]
    assert [(r.name, r.status, r.reason) for r in required if r.status != "pass"] == []
    train = by_name["L5.lora.train"].metrics
    assert train["trainable_params"] == 16384
    assert train["steps"] == level5.LORA_STEPS
    assert train["loss_last"] <= train["loss_first"] / 2
    assert train["grad_norm_min"] > 0
    assert by_name["L5.lora.adapter_roundtrip"].metrics["max_abs_diff"] == 0.0
    assert "adapter_model.safetensors" in by_name["L5.lora.adapter_roundtrip"].metrics["files"]
    full = by_name["L5.full_step"].metrics
    assert full["changed_tensors"] == full["tensors"]
    assert full["loss_after"] < full["loss_first"]
    golden = by_name["L6.golden"].metrics
    assert golden["exact"] == golden["cases"] == 6
    assert by_name["L5.unsloth"].status == "skip"
