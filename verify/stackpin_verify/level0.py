"""L0 environment: versions against the image's pins, backend, devices, cgroups, DTK env."""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from stackpin_verify import boundary, capability, dtk_env, environment, imports
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import Context

_SPEC = re.compile(r"^\s*(==|!=|<=|>=|<|>)\s*([0-9][0-9.]*)\s*$")


def run(ctx: Context) -> list[CheckResult]:
    checks: list[tuple[str, Callable[[], Metrics], bool]] = [
        ("L0.image_info", lambda: check_image_info(ctx), True),
        ("L0.python", check_python, True),
        ("L0.backend", lambda: check_backend(ctx), True),
        ("L0.devices", lambda: check_devices(ctx), True),
        ("L0.arch", lambda: check_arch(ctx), True),
        ("L0.torch_version", lambda: check_torch_version(ctx), True),
        ("L0.numpy", lambda: check_numpy(ctx), True),
        ("L0.pins", lambda: check_pins(ctx), True),
        ("L0.dtk_env", lambda: check_dtk_env(ctx), True),
        ("L0.path", lambda: check_path(os.environ), True),
        ("L0.boundary", lambda: check_boundary(ctx), True),
        (imports.CHECK, lambda: imports.check_imports(ctx), True),
        ("L0.cgroup", check_cgroup, False),
    ]
    if ctx.cache.get(imports.DEFERRED):  # launched at the start, judged after the levels
        checks = [check for check in checks if check[0] != imports.CHECK]
    return [run_check(name, fn, required=req) for name, fn, req in checks]


def check_image_info(ctx: Context) -> Metrics:
    if ctx.image_error:
        raise CheckFailed(ctx.image_error)
    if ctx.image is None:
        msg = "no image info (not inside a stackpin image); version-vs-pin checks skip"
        raise Skip(msg)
    return {key: ctx.image.get(key) for key in ("cell", "variant", "platform", "lock_digest")}


def check_python() -> Metrics:
    return {"version": platform.python_version(), "executable": sys.executable}


def judge_backend(backend: str, image_platform: str, expected: str) -> str | None:
    """``expected`` is the backend the image's platform reports (image.json's
    platform_facts, from stackpin's platform spec: a DTK build is a HIP build, rocm)."""
    if not expected:
        return (f"image platform {image_platform!r}: image.json names no backend for it "
                "(platform_facts); rebuild the image with this stackpin")
    if backend != expected:
        return (
            f"backend is {backend!r} but the image is built for {image_platform!r} "
            f"(expected {expected!r}): wrong torch build or no device visible"
        )
    return None


def check_backend(ctx: Context) -> Metrics:
    metrics: Metrics = {
        "backend": ctx.backend,
        "torch_version_hip": getattr(torch.version, "hip", None),
        "torch_version_cuda": getattr(torch.version, "cuda", None),
        "cuda_is_available": torch.cuda.is_available(),
    }
    platform_name = ctx.image_field("platform")
    if platform_name:
        _unsupported_without_devices(ctx)
        expected = str(ctx.platform_facts.get("backend") or "")
        require(judge_backend(ctx.backend, platform_name, expected), metrics)
    return metrics


# Set by `stackpin verify run --no-devices`: the run passed no device flags on purpose (an
# accelerator image checked on a host with no card), so a missing device is "unsupported",
# never a pass, and never a fault of the image either.
NO_DEVICES_ENV = "STACKPIN_NO_DEVICES"


UNSUPPORTED_NO_DEVICE = "unsupported: no device (the run passed no device flags: --no-devices)"


def no_device_run(ctx: Context) -> bool:
    """An accelerator image run without its device flags on purpose (--no-devices), and
    indeed no device visible: what needs a device is unsupported here, never passed."""
    accelerator = bool(ctx.platform_facts.get("accelerator"))
    return accelerator and not ctx.accelerated and os.environ.get(NO_DEVICES_ENV) == "1"


def _unsupported_without_devices(ctx: Context) -> None:
    if no_device_run(ctx):
        raise Skip(UNSUPPORTED_NO_DEVICE)


def judge_devices(count: int, image_platform: str, facts: Mapping[str, object]) -> str | None:
    """An accelerator image (``facts``: image.json's platform_facts) must see a device."""
    if facts.get("accelerator") and count == 0:
        hint = facts.get("device_hint") or "the platform's device flags"
        return f"{image_platform} image but no device is visible: pass the device flags ({hint})"
    return None


def check_devices(ctx: Context) -> Metrics:
    found = environment.devices()
    metrics: Metrics = {"count": len(found), "devices": found}
    if not found:
        _unsupported_without_devices(ctx)
    require(judge_devices(len(found), ctx.image_field("platform"), ctx.platform_facts), metrics)
    return metrics


def _arch_key(arch: str) -> str:
    """``sm_90``/``sm90`` -> ``sm90``; ``gfx928:sramecc+:xnack-`` -> ``gfx928``."""
    return arch.split(":", 1)[0].replace("_", "").lower()


def judge_arch(device_arch: str, cell_arch: Sequence[str]) -> str | None:
    """The device must be one the image was built for: a wheel built for gfx936 raises
    "no kernel image" (or hipErrorNoBinaryForGpu) on a gfx928 at the first kernel."""
    if _arch_key(device_arch) in {_arch_key(a) for a in cell_arch}:
        return None
    return (
        f"device arch {device_arch} is not among the image's {', '.join(cell_arch)}: "
        "its kernels were built for another GPU"
    )


def check_arch(ctx: Context) -> Metrics:
    cell_arch = [str(a) for a in (ctx.image or {}).get("arch") or []]
    if not ctx.accelerated:
        msg = "no accelerator: nothing to compare with the image's arch"
        raise Skip(msg)
    if not cell_arch:
        msg = "image info declares no arch"
        raise Skip(msg)
    device_arch = capability.device_arch(ctx.device)
    metrics: Metrics = {"device_arch": device_arch, "image_arch": cell_arch}
    require(judge_arch(device_arch, cell_arch), metrics)
    return metrics


def local_label(version: str) -> str:
    return version.partition("+")[2]


def judge_torch_version(actual: str, pinned: str) -> str | None:
    """Exact equality, local label included: the label is what tells a vendor DTK build
    (``+das.opt1.dtk2604``) from a generic wheel pip may have swapped in."""
    if actual == pinned:
        return None
    return (
        f"torch {actual} differs from the pin {pinned} (local label "
        f"{local_label(actual) or '<none>'!r} vs pinned {local_label(pinned) or '<none>'!r})"
    )


def judge_torch_runtime(runtime: str, installed: str, pinned: str) -> str | None:
    """The imported torch must be the installed distribution. One difference is allowed:
    PyPI's CUDA builds carry no local label in their metadata (``2.11.0``) and add one at
    run time (``2.11.0+cu130``). A build whose metadata has a label must report exactly it,
    so a torch whose runtime label was changed (``+cu121`` under a ``+cpu`` pin) fails."""
    if runtime == installed:
        return None
    if "+" not in installed and runtime.partition("+")[0] == installed:
        return None
    return judge_torch_version(runtime, pinned) or (
        f"the imported torch is {runtime}, the installed distribution {installed}")


def check_torch_version(ctx: Context) -> Metrics:
    runtime = str(torch.__version__)
    actual = environment.dist_version("torch") or runtime
    pinned = str((ctx.image or {}).get("torch") or ctx.pins.get("torch") or "")
    if not pinned:
        msg = "no torch pin in image info"
        raise Skip(msg)
    metrics: Metrics = {"actual": actual, "runtime": runtime, "pinned": pinned}
    reason = judge_torch_version(actual, pinned) or judge_torch_runtime(runtime, actual, pinned)
    require(reason, metrics)
    return metrics


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", version)
    if match is None:
        msg = f"cannot parse version {version!r}"
        raise ValueError(msg)
    return tuple(int(part) for part in match.group(0).split("."))


def satisfies(version: str, constraint: str) -> bool:
    """A small subset of PEP 440 specifiers (``<2``, ``>=1.26,<2``), enough for the pins
    images record, without depending on ``packaging``."""
    actual = _release(version)
    for clause in filter(None, (c.strip() for c in constraint.split(","))):
        match = _SPEC.match(clause)
        if match is None:
            msg = f"unsupported version constraint {clause!r}"
            raise ValueError(msg)
        op, bound_text = match.groups()
        bound = _release(bound_text)
        width = max(len(actual), len(bound))
        left = actual + (0,) * (width - len(actual))
        right = bound + (0,) * (width - len(bound))
        ok = {
            "==": left == right,
            "!=": left != right,
            "<": left < right,
            "<=": left <= right,
            ">": left > right,
            ">=": left >= right,
        }[op]
        if not ok:
            return False
    return True


def judge_numpy(version: str | None, constraint: str) -> str | None:
    if version is None:
        return f"numpy is not installed but the image requires numpy{constraint}"
    if not satisfies(version, constraint):
        return (
            f"numpy {version} violates the image constraint numpy{constraint}: "
            "numpy 2 breaks these torch builds silently at import or first op"
        )
    return None


def numpy_roundtrip() -> str | None:
    """A real torch<->numpy exchange: an ABI mismatch shows up here, not at import."""
    import numpy as np

    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = torch.from_numpy(array) * 2
    back = tensor.numpy()
    if back.tolist() != (array * 2).tolist():
        return f"torch<->numpy round trip gave {back.tolist()}"
    return None


def check_numpy(ctx: Context) -> Metrics:
    version = environment.dist_version("numpy")
    constraint = str((ctx.image or {}).get("numpy") or "")
    metrics: Metrics = {"version": version, "constraint": constraint or None}
    if constraint:
        require(judge_numpy(version, constraint), metrics)
    if version is None:
        msg = "numpy is not installed and the image sets no numpy constraint"
        raise Skip(msg)
    require(numpy_roundtrip(), metrics)
    return metrics


def judge_pins(pins: Mapping[str, str], installed: Mapping[str, str | None]) -> str | None:
    problems = []
    for dist, pinned in sorted(pins.items()):
        actual = installed.get(dist)
        if actual is None:
            problems.append(f"{dist}: pinned {pinned}, not installed")
        elif actual != pinned:
            problems.append(f"{dist}: pinned {pinned}, installed {actual}")
    if problems:
        return "installed versions differ from the pins: " + "; ".join(problems)
    return None


def check_pins(ctx: Context) -> Metrics:
    if ctx.image is None:
        msg = "no image info: nothing to compare against"
        raise Skip(msg)
    installed = {dist: environment.dist_version(dist) for dist in ctx.pins}
    metrics: Metrics = {"pinned": len(ctx.pins), "installed": installed}
    require(judge_pins(ctx.pins, installed), metrics)
    return metrics


def check_dtk_env(ctx: Context) -> Metrics:
    """The cell's DTK env script, sourced in a clean shell, against this process's
    environment and the tree it names (dtk_env.py): forgetting it fails late and
    confusingly (dcu-facts)."""
    env_script = ctx.image_field("env_script")
    if not env_script:
        msg = "image declares no DTK env script"
        raise Skip(msg)
    if not Path(env_script).is_file():
        msg = f"DTK env script {env_script} does not exist"
        raise CheckFailed(msg, {"env_script": env_script})
    version = dtk_env.cell_dtk_version(
        ctx.image_field("platform_version"), ctx.image_field("torch")
    )
    try:
        metrics, reason = dtk_env.check(env_script, os.environ, version)
    except dtk_env.SourceError as exc:
        raise CheckFailed(str(exc), {"env_script": env_script}) from exc
    require(reason, metrics)
    return metrics


def check_boundary(ctx: Context) -> Metrics:
    """The vendor boundary of image.json (boundary.py: the build guard's rule too)."""
    image: dict[str, Any] = ctx.image or {}
    provided = image.get("provided") or {}
    excluded = image.get("excluded") or {}
    if not provided and not excluded:
        msg = "the image declares no vendor boundary"
        raise Skip(msg)
    metrics: Metrics = {"provided": sorted(provided), "excluded": sorted(excluded)}
    require(boundary.judge_boundary(provided, excluded, environment.dist_version), metrics)
    return metrics


# Set by the Dockerfile to the base image's PATH, in the same ENV that extends it.
BASE_PATH_ENV = "STACKPIN_BASE_PATH"


def judge_path(path: str, base_path: str, tools: Mapping[str, Sequence[str]]) -> str | None:
    """Every entry of the base image's PATH must still be on the image's: a Dockerfile that
    sets PATH outright loses the vendor's tools (hy-smi, rocm-smi, the DTK compilers), and
    nothing fails until someone reaches for one. ``tools``: what each lost folder held."""
    have = set(path.split(":"))
    lost = [entry for entry in base_path.split(":") if entry and entry not in have]
    if not lost:
        return None
    named = [f"{entry} ({', '.join(tools.get(entry, ())) or 'empty here'})" for entry in lost]
    return (f"PATH lost the base image's {'; '.join(named)}: the Dockerfile set PATH instead "
            "of extending the base's")


def check_path(environ: Mapping[str, str]) -> Metrics:
    base_path = environ.get(BASE_PATH_ENV)
    if not base_path:
        msg = f"the image records no base PATH ({BASE_PATH_ENV}: built before it was recorded)"
        raise Skip(msg)
    path = environ.get("PATH", "")
    metrics: Metrics = {"path": path, "base_path": base_path}
    tools = {entry: _listing(entry) for entry in base_path.split(":") if entry}
    require(judge_path(path, base_path, tools), metrics)
    return metrics


def _listing(folder: str) -> list[str]:
    try:
        return sorted(p.name for p in Path(folder).iterdir())[:5]
    except OSError:
        return []


def check_cgroup() -> Metrics:
    return {
        "cpu_count": os.cpu_count(),
        "cgroup_cpus": environment.cgroup_cpus(),
        "cgroup_memory_bytes": environment.cgroup_memory_bytes(),
        "torch_threads": torch.get_num_threads(),
    }
