"""A broken kernel fails (issue 13 item 1): "unsupported dtype" comes from capability
tables, never from a kernel's exception; a level that passed nothing fails; and a real run
with matmul raising CUDA's "no kernel image" error exits 1 with L1 failing by name."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
import torch
import verify_helpers

from stackpin_verify import capability, level1, report, runner
from stackpin_verify.checks import CheckResult, run_check

FAULTS = verify_helpers.ROOT / "tests" / "faults"
NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"


def _raise(*args, **kwargs):
    raise RuntimeError(NO_KERNEL)


# --- capability tables --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "bf16"),
    [("sm_90", True), ("sm_80", True), ("sm_86", True), ("sm_75", False), ("sm_70", False),
     ("gfx928", True), ("gfx936", True), ("gfx90a", True), ("gfx942", True), ("gfx1100", True),
     ("gfx906", False), ("gfx908", False)],
)
def test_bf16_support_comes_from_the_arch(arch, bf16):
    assert (capability.accelerator_unsupported("bf16", arch) is None) is bf16
    assert capability.accelerator_unsupported("fp16", arch) is None
    assert capability.accelerator_unsupported("fp32", arch) is None


def test_flash_attention_needs_ampere_on_cuda():
    assert capability.flash_unsupported("sm_80") is None
    assert capability.flash_unsupported("sm_90") is None
    assert "8.0 or newer; this device is sm_75" in capability.flash_unsupported("sm_75")
    assert capability.flash_unsupported("gfx928") is None


def test_cpu_fp32_is_supported_without_running_anything():
    assert capability.cpu_unsupported("fp32", _raise) is None


def test_cpu_lower_precision_is_unsupported_only_on_the_dispatchers_message():
    def missing_half():
        msg = '"addmm_impl_cpu_" not implemented for \'Half\''
        raise RuntimeError(msg)

    assert "not implemented on CPU" in capability.cpu_unsupported("fp16", missing_half)
    with pytest.raises(RuntimeError, match="not implemented for 'Half'"):
        capability.cpu_unsupported("bf16", missing_half)  # wrong dtype named: a fault
    with pytest.raises(RuntimeError, match="no kernel image"):
        capability.cpu_unsupported("bf16", _raise)
    assert capability.cpu_unsupported("bf16", lambda: None) is None


def test_accelerator_never_runs_the_probe(monkeypatch):
    monkeypatch.setattr(capability, "device_arch", lambda device: "sm_90")
    assert capability.unsupported("bf16", torch.device("cuda"), _raise) is None
    monkeypatch.setattr(capability, "device_arch", lambda device: "sm_75")
    reason = capability.unsupported("bf16", torch.device("cuda"), _raise)
    assert reason == "bf16 needs compute capability 8.0 or newer; this device is sm_75"


def test_cpu_device_report(monkeypatch):
    # As on a GPU host (the H200's GPU-visible run found it): Triton sees the GPU, the run
    # judges the CPU, and the CPU has no Triton target.
    monkeypatch.setattr(capability, "triton_target",
                        lambda: {"backend": "cuda", "arch": "90", "warp_size": 32})
    facts = capability.device_report(torch.device("cpu"))
    assert facts == {
        "type": "cpu", "arch": "cpu", "bf16_supported": None, "torch_bf16_supported": None,
        "triton_target": None,
    }


# --- L1 with "no kernel image" ----------------------------------------------------------------


def test_gemm_raising_no_kernel_image_fails_every_dtype_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "__matmul__", _raise)
    results = level1.run(verify_helpers.cpu_context())
    assert [r.name for r in results[:3]] == ["L1.gemm.fp32", "L1.gemm.fp16", "L1.gemm.bf16"]
    assert len(results) == 3 + 9  # and edges, large_k, batched per dtype
    assert all(r.status == "fail" and NO_KERNEL in r.reason for r in results)


def test_gemm_raising_no_kernel_image_fails_on_an_accelerator(monkeypatch):
    """The accelerator path: capability says bf16 is supported (sm_90), so the exception
    from the product is the check's failure, not a skip."""
    monkeypatch.setattr(capability, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(torch.Tensor, "__matmul__", _raise)
    ctx = verify_helpers.cpu_context()
    assert level1.dtype_unsupported("bf16", torch.device("cuda")) is None
    result = run_check("L1.gemm.bf16", functools.partial(level1.check_gemm, ctx, "bf16"))
    assert result.status == "fail" and NO_KERNEL in result.reason


# --- a level that passed nothing --------------------------------------------------------------


def _result(status: str, required: bool = True, reason: str = "") -> CheckResult:
    return CheckResult(name="L1.x", level=1, required=required, status=status, reason=reason)


def test_level_judge():
    assert runner.judge_level([_result("pass"), _result("skip")], accelerated=True) is None
    assert runner.judge_level([_result("skip", reason="a"), _result("skip", reason="b")],
                              accelerated=False) == "no check passed: a; b"
    assert runner.judge_level([], accelerated=False) == "no check passed"
    only_optional = [_result("skip", reason="x"), _result("pass", required=False)]
    assert runner.judge_level(only_optional, accelerated=False) is None
    assert runner.judge_level(only_optional, accelerated=True) == (
        "on an accelerator, every required check skipped"
    )


def test_requested_level_that_passed_nothing_fails_the_run():
    ctx = verify_helpers.cpu_context()
    results, _ = runner.run_levels(ctx, [2], requested=True)
    assert [r.status for r in results[:-1]] == ["skip", "skip", "skip"]
    assert (results[-1].name, results[-1].status) == ("L2.level", "fail")
    assert results[-1].reason.startswith("no check passed: ")
    built = report.build_report(checks=results, host={}, image=None, backend="cpu",
                                versions={}, devices=[], duration_s=0.0)
    assert report.exit_code(built) == 1


def test_default_run_leaves_out_what_cannot_apply_here_and_says_why():
    ctx = verify_helpers.cpu_context()
    results, _ = runner.run_levels(ctx, [2, 4], requested=False)
    assert [(r.name, r.status) for r in results] == [("L2.level", "skip"), ("L4.level", "skip")]
    assert results[0].reason == (
        "left out of the default run: no accelerator: the Triton kernels compile for a GPU; "
        "--levels runs it"
    )
    assert "bitsandbytes is neither installed nor declared" in results[1].reason
    declared = verify_helpers.cpu_context(verify_helpers.image_info(bitsandbytes="disabled"))
    assert runner.left_out_by_default(declared, 4) is None
    assert runner.left_out_by_default(declared, 1) is None


# --- the real program with the fault injected at start-up -------------------------------------


def run_with_fault(fault: str, *args: str, cwd) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STACKPIN_FAULT=fault,
               PYTHONPATH=os.pathsep.join([str(FAULTS), str(verify_helpers.VERIFY_DIR)]))
    return subprocess.run(
        [sys.executable, "-m", "stackpin_verify", *args, "--out-dir", "out", "--json"],
        cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600,
    )


def test_no_kernel_image_from_matmul_fails_l1_and_the_run(tmp_path):
    done = run_with_fault("matmul_no_kernel_image", "--levels", "1", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    for name in ("L1.gemm.fp32", "L1.gemm.fp16", "L1.gemm.bf16"):
        assert checks[name]["status"] == "fail"
        assert NO_KERNEL in checks[name]["reason"]
    assert checks["L1.level"]["reason"].startswith("no check passed")


def test_no_kernel_image_from_sdpa_fails_every_l3_case(tmp_path):
    done = run_with_fault("sdpa_no_kernel_image", "--levels", "3", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    sdpa = [c for c in json.loads(done.stdout)["checks"] if c["name"].startswith("L3.sdpa.")]
    assert len(sdpa) == 24 + 24 + 6  # plain, padded-batch and range cases
    assert all(c["status"] == "fail" and NO_KERNEL in c["reason"] for c in sdpa)


# --- L0.arch: the device is one the image was built for ------------------------------------


def test_arch_judge_normalises_spellings_and_names_the_mismatch():
    from stackpin_verify import level0

    assert level0.judge_arch("sm_90", ["sm_90"]) is None
    assert level0.judge_arch("sm_90", ["sm90"]) is None
    assert level0.judge_arch("gfx928", ["gfx928:sramecc+:xnack-"]) is None
    assert level0.judge_arch("gfx928", ["gfx936"]) == (
        "device arch gfx928 is not among the image's gfx936: its kernels were built for another GPU"
    )


def test_arch_check_fails_on_an_accelerator_of_another_arch(monkeypatch):
    from stackpin_verify import level0

    monkeypatch.setattr(capability, "device_arch", lambda device: "gfx928")
    ctx = verify_helpers.cpu_context(verify_helpers.image_info(arch=["gfx936"], platform="dtk"))
    ctx.device = torch.device("cuda")  # the check only asks capability.device_arch
    result = run_check("L0.arch", functools.partial(level0.check_arch, ctx))
    assert result.status == "fail"
    assert result.metrics == {"device_arch": "gfx928", "image_arch": ["gfx936"]}
    cpu = verify_helpers.cpu_context(verify_helpers.image_info(arch=["gfx936"]))
    assert run_check("L0.arch", functools.partial(level0.check_arch, cpu)).status == "skip"


# --- wiring: each check compares with an independent reference, at its real tolerance ---------


def test_gemm_that_is_wrong_in_low_precision_fails_against_the_float64_reference(monkeypatch):
    """A GEMM compared with itself would pass this: only the float64 reference is honest."""
    real = torch.Tensor.__matmul__

    def off_by_one_percent(a, b):
        out = real(a, b)
        return out if out.dtype == torch.float64 else out * 1.01

    monkeypatch.setattr(torch.Tensor, "__matmul__", off_by_one_percent)
    result = run_check("L1.gemm.fp32", functools.partial(level1.check_gemm, verify_helpers.cpu_context(), "fp32"))
    assert result.status == "fail"
    assert result.reason.startswith("relative error ")


@pytest.mark.parametrize(("kind", "garbage_scale"), [("int8", 0.1), ("nf4", 0.3)])
def test_l4_tolerances_reject_a_quantized_matmul_this_wrong(kind, garbage_scale):
    """The tolerances the checks use (not a test's own number) must reject outputs with a
    relative RMS error of 0.1 (int8) or 0.3 (NF4): a tolerance of 1e9 would pass them."""
    from stackpin_verify import level4

    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(64, 512, generator=gen)
    noisy = ref + garbage_scale * ref.norm() / ref.numel() ** 0.5 * torch.randn(64, 512, generator=gen)
    assert level4.relative_rms(noisy, ref) == pytest.approx(garbage_scale, rel=0.05)
    assert level4.judge_quantized(noisy, ref, level4.TOLERANCE[kind]) is not None


# --- an import that kills the process is reported, not a silent crash -------------------------


def test_describe_exit_names_the_signal():
    from stackpin_verify import preflight

    assert preflight.describe_exit(-7) == "was killed by SIGBUS"
    assert preflight.describe_exit(1) == "exited with 1"


def test_torch_import_killing_the_process_fails_l0_import_with_a_report(tmp_path):
    done = run_with_fault("torch_import_sigbus", "--levels", "0,1", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    report_json = json.loads(done.stdout)
    assert report_json == json.loads((tmp_path / "out" / "report.json").read_text())
    [check] = report_json["checks"]
    assert (check["name"], check["status"], check["required"]) == ("L0.import", "fail", True)
    assert check["reason"].startswith(
        "python -c 'import torch; torch.zeros(1)' was killed by SIGBUS"
    )
    from stackpin_verify import schema

    assert schema.validate(report_json, schema.load_schema()) == []


def test_kernel_narrowing_bf16_fails_the_range_case_by_name_in_a_real_run(tmp_path):
    done = run_with_fault("sdpa_narrow_bf16", "--levels", "3", "--dtype", "bf16", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    failed = sorted(name for name, c in checks.items() if c["status"] == "fail")
    assert "L3.sdpa.bf16.range.values" in failed
    assert "outputs are not finite (inf or NaN)" in checks["L3.sdpa.bf16.range.values"]["reason"]
    # Every unit-variance case passes: only the range case sees the narrowing.
    unit = [c for n, c in checks.items() if ".dense." in n or ".gqa." in n]
    assert unit and all(c["status"] == "pass" for c in unit)
