"""L0 pure pieces: backend labels, cgroup limits, version constraints, image info, DTK."""

from __future__ import annotations

import functools
import json

import pytest
import torch
import verify_helpers

from stackpin_verify import environment, level0, level2, level4
from stackpin_verify.checks import run_check


def test_hip_build_is_labelled_rocm_even_though_cuda_api_reports_a_device(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.3.26045", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert environment.detect_backend() == "rocm"


def test_backend_labels():
    assert environment.backend_label(hip="6.3", cuda="12.1", device_available=True) == "rocm"
    assert environment.backend_label(hip=None, cuda="12.1", device_available=True) == "cuda"
    assert environment.backend_label(hip=None, cuda="12.1", device_available=False) == "cpu"
    assert environment.backend_label(hip=None, cuda=None, device_available=False) == "cpu"


def test_backend_check_fails_when_a_dtk_image_runs_on_cpu_torch():
    ctx = verify_helpers.cpu_context(verify_helpers.image_info(platform="dtk"))
    result = run_check("L0.backend", functools.partial(level0.check_backend, ctx))
    assert result.status == "fail"
    assert "backend is 'cpu' but the image is built for 'dtk' (expected 'rocm')" in result.reason


def _facts(platform: str) -> dict[str, object]:
    return verify_helpers.image_info(platform=platform)["platform_facts"]


def test_devices_check_names_the_missing_device_flags():
    assert level0.judge_devices(0, "dtk", _facts("dtk")) == (
        "dtk image but no device is visible: pass the device flags "
        "(/dev/kfd, /dev/dri (and /dev/mkfd))"
    )
    assert level0.judge_devices(0, "cpu", _facts("cpu")) is None
    assert level0.judge_devices(2, "cuda", _facts("cuda")) is None


def test_cgroup_v2_limits(tmp_path):
    (tmp_path / "cpu.max").write_text("1500000 100000\n")
    (tmp_path / "memory.max").write_text("63350767616\n")
    assert environment.cgroup_cpus(tmp_path) == 15.0
    assert environment.cgroup_memory_bytes(tmp_path) == 63350767616


def test_cgroup_v2_unlimited(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert environment.cgroup_cpus(tmp_path) is None
    assert environment.cgroup_memory_bytes(tmp_path) is None


def test_cgroup_v1_limits_and_unlimited(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "memory").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert environment.cgroup_cpus(tmp_path) == 2.0
    assert environment.cgroup_memory_bytes(tmp_path) is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("1073741824\n")
    assert environment.cgroup_cpus(tmp_path) is None
    assert environment.cgroup_memory_bytes(tmp_path) == 1073741824


def test_no_cgroup_files(tmp_path):
    assert environment.cgroup_cpus(tmp_path) is None
    assert environment.cgroup_memory_bytes(tmp_path) is None


@pytest.mark.parametrize(
    ("version", "constraint", "ok"),
    [
        ("1.26.4", "<2", True),
        ("2.0.0", "<2", False),
        ("2.1.3", "<2", False),
        ("1.26.4", ">=1.26,<2", True),
        ("1.25.0", ">=1.26,<2", False),
        ("1.26", "==1.26.0", True),
        ("2.0.0rc1", "<2", False),
    ],
)
def test_version_constraints(version, constraint, ok):
    assert level0.satisfies(version, constraint) is ok


def test_unsupported_constraint_is_an_error():
    with pytest.raises(ValueError, match=r"unsupported version constraint '~=1\.26'"):
        level0.satisfies("1.26.4", "~=1.26")


def test_pins_report_every_mismatch():
    reason = level0.judge_pins(
        {"peft": "0.21.0", "trl": "1.16.0", "torch": "2.13.0+cpu"},
        {"peft": "0.21.0", "trl": "1.17.0", "torch": None},
    )
    assert reason == (
        "installed versions differ from the pins: torch: pinned 2.13.0+cpu, not installed; "
        "trl: pinned 1.16.0, installed 1.17.0"
    )


def test_image_info_loading(tmp_path):
    path = tmp_path / "image.json"
    path.write_text(json.dumps(verify_helpers.image_info()))
    assert environment.load_image_info(path)["cell"] == "cpu-bookworm-torch2130-py311"
    path.write_text(json.dumps({"schema": 2}))
    with pytest.raises(environment.ImageInfoError, match="is not schema 1"):
        environment.load_image_info(path)
    path.write_text("{")
    with pytest.raises(environment.ImageInfoError, match="cannot read image info"):
        environment.load_image_info(path)


def test_hip_lld_path_must_be_named_ld_lld(tmp_path):
    lld = tmp_path / "lld"
    ld_lld = tmp_path / "ld.lld"
    ld_lld.write_text("")
    is_file = lambda p: (tmp_path / p).is_file()  # noqa: E731
    assert level2.judge_hip_lld(str(ld_lld), is_file=is_file, required_on="DTK") is None
    reason = level2.judge_hip_lld(str(lld), is_file=is_file, required_on="DTK")
    assert reason == f"TRITON_HIP_LLD_PATH={lld} is not a file named ld.lld (HSACO link would fail)"
    missing = tmp_path / "bin" / "ld.lld"
    assert level2.judge_hip_lld(str(missing), is_file=is_file, required_on="") == (
        f"TRITON_HIP_LLD_PATH={missing} does not exist"
    )
    assert level2.judge_hip_lld(None, is_file=is_file, required_on="") is None
    assert "unset on a DTK image" in str(
        level2.judge_hip_lld(None, is_file=is_file, required_on="DTK"))


def test_triton_checks_skip_without_triton_or_device():
    ctx = verify_helpers.cpu_context()
    result = run_check("L2.triton.vector_add", functools.partial(level2.check_vector_add, ctx))
    assert result.status == "skip"
    assert result.reason in ("triton is not installed", "no accelerator: Triton kernels need a GPU")


def test_disabled_bitsandbytes_gate():
    clean = level4.judge_disabled(
        bnb_installed=False,
        transformers_claims=False,
        unsloth_installed=True,
        environ={"UNSLOTH_DISABLE_BITSANDBYTES": "1"},
    )
    assert clean is None
    advertised = level4.judge_disabled(
        bnb_installed=True,
        transformers_claims=True,
        unsloth_installed=True,
        environ={},
    )
    assert advertised == (
        "bitsandbytes is installed although the image declares it disabled (a generic wheel "
        "claims ROCm support, then fails); transformers reports bitsandbytes as available; "
        "unsloth is installed but UNSLOTH_DISABLE_BITSANDBYTES is not set to 1"
    )


def test_declared_bitsandbytes_must_be_installed():
    ctx = verify_helpers.cpu_context(verify_helpers.image_info(bitsandbytes="vendor"))
    result = run_check("L4.bitsandbytes", functools.partial(level4.check_gate, ctx))
    if result.metrics.get("installed"):
        pytest.skip("bitsandbytes is installed here")
    assert result.status == "fail"
    assert result.reason == "image declares bitsandbytes from vendor but it is not installed"


def test_quantized_matmul_judge():
    ref = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    assert level4.judge_quantized(ref * 1.01, ref, 0.05) is None
    assert level4.judge_quantized(torch.zeros_like(ref), ref, 0.05) == (
        "quantized matmul relative RMS error 1 exceeds 0.05"
    )
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert level4.judge_quantized(nan, ref, 0.05) == "quantized matmul produced non-finite values"


def test_unreadable_image_info_fails_the_image_check():
    ctx = verify_helpers.cpu_context(
        image_error="image info /opt/stackpin/image.json is not schema 1"
    )
    result = run_check("L0.image_info", functools.partial(level0.check_image_info, ctx))
    assert (result.status, result.reason) == (
        "fail",
        "image info /opt/stackpin/image.json is not schema 1",
    )


def test_a_pinned_package_that_is_missing_fails_instead_of_skipping():
    missing = "stackpin_verify_absent_pkg"
    pinned = verify_helpers.cpu_context(verify_helpers.image_info(pins={missing: "1.0"}))
    result = run_check("L5.unsloth", lambda: {"module": str(pinned.need_module(missing))})
    assert (result.status, result.reason) == (
        "fail",
        f"{missing} is pinned in the image but not installed",
    )
    unpinned = verify_helpers.cpu_context(verify_helpers.image_info())
    result = run_check("L5.unsloth", lambda: {"module": str(unpinned.need_module(missing))})
    assert (result.status, result.reason) == ("skip", f"{missing} is not installed")


def test_boundary_judge_names_excluded_and_swapped_vendor_builds():
    from stackpin_verify import boundary

    versions = {"torch": "2.9.0+das.opt1.dtk2604", "bitsandbytes": "0.47.0", "triton": "3.5.0"}
    provided = {"torch": {"version": "2.9.0+das.opt1.dtk2604"},
                "triton": {"version": "3.5.0+das.opt1.dtk2604"}}
    verdict = boundary.judge_boundary(provided, {"bitsandbytes": "no native build"},
                                      versions.get)
    assert verdict is not None
    assert "bitsandbytes 0.47.0 is installed but excluded here (no native build)" in verdict
    assert "triton is 3.5.0, not the vendor's 3.5.0+das.opt1.dtk2604" in verdict
    assert "torch" not in verdict.replace("torch 2.9", "")
    assert boundary.judge_boundary(provided, {}, {**versions, "triton": provided["triton"][
        "version"]}.get) is None
