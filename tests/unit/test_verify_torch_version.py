"""L0.torch_version: the installed torch's metadata against the pin, exactly; the imported
torch against that distribution's release (PyPI's CUDA builds add +cu130 at run time)."""

from __future__ import annotations

import verify_helpers  # noqa: F401 - puts verify/ on the path

from stackpin_verify.level0 import judge_torch_runtime, judge_torch_version


def test_pypi_cuda_torch_passes_with_its_runtime_label() -> None:
    assert judge_torch_version("2.11.0", "2.11.0") is None
    assert judge_torch_runtime("2.11.0+cu130", "2.11.0", "2.11.0") is None
    assert judge_torch_runtime("2.13.0+cpu", "2.13.0+cpu", "2.13.0+cpu") is None


def test_a_generic_torch_in_place_of_the_vendor_build_still_fails() -> None:
    reason = judge_torch_version("2.9.0", "2.9.0+das.opt1.dtk2604")
    assert reason is not None and "'<none>' vs pinned 'das.opt1.dtk2604'" in reason


def test_an_imported_torch_of_another_release_fails() -> None:
    # A torch on sys.path ahead of the installed one (PYTHONPATH, a stray folder).
    reason = judge_torch_runtime("2.10.0+cu128", "2.11.0", "2.11.0")
    assert reason is not None and reason.startswith("torch 2.10.0+cu128 differs from the pin")


def test_a_runtime_label_changed_under_a_labelled_build_fails() -> None:
    # The fault image's torch: version.py edited to +cu121 while its metadata says +cpu.
    reason = judge_torch_runtime("2.13.0+cu121", "2.13.0+cpu", "2.13.0+cpu")
    assert reason is not None and "local label 'cu121' vs pinned 'cpu'" in reason
    # Nor may an unlabelled build add a label to another release.
    assert judge_torch_runtime("2.12.0+cu130", "2.11.0", "2.11.0") is not None


def test_no_device_on_purpose_is_unsupported_never_a_pass(monkeypatch) -> None:
    import pytest
    from verify_helpers import cpu_context, image_info

    from stackpin_verify import level0
    from stackpin_verify.checks import CheckFailed, Skip

    ctx = cpu_context(image_info(platform="cuda"))
    monkeypatch.setattr(level0.environment, "devices", list)
    with pytest.raises(CheckFailed):  # no device and nobody said so: a fault
        level0.check_devices(ctx)
    monkeypatch.setenv(level0.NO_DEVICES_ENV, "1")
    for check in (level0.check_devices, level0.check_backend):
        with pytest.raises(Skip, match="unsupported: no device"):
            check(ctx)
    # A CPU image is judged as before: the flag says nothing about it.
    assert level0.check_devices(cpu_context(image_info(platform="cpu")))["count"] == 0


def test_without_devices_every_kernel_level_is_unsupported_and_never_runs(monkeypatch) -> None:
    """--no-devices on a CUDA image: L1-L7 would run their CPU paths and pass, proving
    nothing about the image's device stack; each is one unsupported line, requested or not,
    and no level module is even imported. L8 (the service) is not a kernel level."""
    import importlib

    from verify_helpers import cpu_context, image_info

    from stackpin_verify import level0, runner

    imported: list[str] = []
    real_import = importlib.import_module

    def recording_import(name: str, *args: object):
        imported.append(name)
        return real_import(name, *args)

    monkeypatch.setattr(runner.importlib, "import_module", recording_import)
    monkeypatch.setenv(level0.NO_DEVICES_ENV, "1")
    ctx = cpu_context(image_info(platform="cuda"))
    results, _ = runner.run_levels(ctx, range(1, 8))
    assert [(r.name, r.status) for r in results] == [(f"L{n}.level", "skip") for n in range(1, 8)]
    assert {r.reason for r in results} == {level0.UNSUPPORTED_NO_DEVICE}
    assert imported == []
    assert runner.unsupported_here(ctx, 8) is None
    assert runner.unsupported_here(ctx, 0) is None
    # Without the flag, or for a CPU image, the levels run as before (L1 passes on CPU).
    monkeypatch.delenv(level0.NO_DEVICES_ENV)
    assert runner.unsupported_here(ctx, 1) is None
    monkeypatch.setenv(level0.NO_DEVICES_ENV, "1")
    assert runner.unsupported_here(cpu_context(image_info(platform="cpu")), 1) is None
