"""Helpers for the stackpin_verify tests: the package lives in verify/, outside src/."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _package_parent() -> Path:
    """The directory holding the stackpin_verify the tests import (and hand to the programs
    they start): verify/ in a checkout; under mutation testing (scripts/mutation-test.sh)
    mutmut's copy, which it puts on sys.path first, so the tests run the mutated code."""
    spec = importlib.util.find_spec("stackpin_verify")
    if spec is not None and spec.origin is not None:
        return Path(spec.origin).resolve().parents[1]
    sys.path.insert(0, str(ROOT / "verify"))
    return ROOT / "verify"


VERIFY_DIR = _package_parent()

import torch  # noqa: E402 - after the path set-up, like the package itself

from stackpin_verify.context import Context  # noqa: E402


def image_info(**overrides: Any) -> dict[str, Any]:
    """An image.json as the build writes it for the CPU default cell; with ``platform=X``,
    the platform facts stackpin's spec of X renders (render.image_info's ``platform_facts``)."""
    from stackpin import platforms

    info: dict[str, Any] = {
        "schema": 1,
        "cell": "cpu-bookworm-torch2130-py311",
        "variant": "stable",
        "platform": "cpu",
        "lock_digest": "ab" * 32,
        "torch": str(torch.__version__),
        "numpy": "<2",
        "pins": {},
        "bitsandbytes": "disabled",
        "env_script": "",
        "attention": "sdpa",
    }
    info.update(overrides)
    if "platform_facts" not in overrides and info["platform"] in platforms.names():
        info["platform_facts"] = platforms.get(info["platform"]).image_facts()
    return info


def cpu_context(image: dict[str, Any] | None = None, **kwargs: Any) -> Context:
    return device_context(torch.device("cpu"), image, **kwargs)


def run_devices() -> list[torch.device]:
    """The devices a test of a device path runs on: the CPU everywhere, and the GPU where
    one is visible (the H200's mutation run), so a tensor left on the wrong device fails
    there. No test skips for want of a GPU: on a CPU host it runs on the CPU alone."""
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda"))
    return found


def device_context(
    device: torch.device, image: dict[str, Any] | None = None, **kwargs: Any
) -> Context:
    return Context(backend=device.type, device=device, image=image, **kwargs)


def padded_case(case: Any, device: torch.device | None = None) -> Any:
    """One L3 padded-batch case (stackpin_verify.masked.MaskCase) run as the suite runs it,
    on ``device`` (the CPU by default): its CheckResult."""
    from stackpin_verify import masked
    from stackpin_verify.checks import run_check

    ctx = device_context(device or torch.device("cpu"))
    return run_check(case.name, functools.partial(masked.check_padded_sdpa, ctx, case))


FAULTS_MODULE = ROOT / "tests" / "faults" / "sitecustomize.py"


def fault_patches(fault: str) -> list[tuple[object, str, object]]:
    """The (owner, attribute, replacement) triples tests/faults/sitecustomize.py applies at
    a real run's start-up for ``fault``; tests apply them with monkeypatch."""
    spec = importlib.util.spec_from_file_location("stackpin_faults_helper", FAULTS_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    patches: list[tuple[object, str, object]] = module.patches(fault)
    return patches


def apply_fault(monkeypatch: Any, fault: str) -> None:
    for owner, name, replacement in fault_patches(fault):
        monkeypatch.setattr(owner, name, replacement)
