"""L4 quantization gating: bitsandbytes either works for real or is declared off and silent.

A generic bitsandbytes wheel claims ROCm support and then fails on DTK (dcu-facts), so
import success proves nothing: the matmuls must run, or the image must disable it and
nothing in it may advertise 4/8-bit support.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Mapping
from types import ModuleType

import torch

from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import Context
from stackpin_verify.torchnames import CPU

# Relative RMS error ||y - ref|| / ||ref||: int8 row-wise quantization keeps ~1% error,
# NF4 (16 levels per 64-block) ~10%; garbage (zeros, random) sits at >= 1.
TOLERANCE = {"int8": 0.05, "nf4": 0.25}
SHAPE = (64, 256, 512)  # tokens, in features, out features


def run(ctx: Context) -> list[CheckResult]:
    gate = run_check("L4.bitsandbytes", functools.partial(check_gate, ctx))
    results = [gate]
    for kind in ("int8", "nf4"):
        name = f"L4.bitsandbytes.{kind}"
        if ctx.image_field("bitsandbytes") == "disabled" or gate.status != "pass":
            why = (
                "bitsandbytes disabled by the image"
                if gate.status == "pass"
                else (f"L4.bitsandbytes did not pass: {gate.reason}")
            )
            results.append(run_check(name, functools.partial(_skip, why)))
        else:
            results.append(run_check(name, functools.partial(check_matmul, ctx, kind)))
    return results


def _skip(reason: str) -> Metrics:
    raise Skip(reason)


def judge_disabled(
    *,
    bnb_installed: bool,
    transformers_claims: bool,
    unsloth_installed: bool,
    environ: Mapping[str, str],
) -> str | None:
    problems = []
    if bnb_installed:
        problems.append(
            "bitsandbytes is installed although the image declares it disabled "
            "(a generic wheel claims ROCm support, then fails)"
        )
    if transformers_claims:
        problems.append("transformers reports bitsandbytes as available")
    if unsloth_installed and environ.get("UNSLOTH_DISABLE_BITSANDBYTES") != "1":
        problems.append("unsloth is installed but UNSLOTH_DISABLE_BITSANDBYTES is not set to 1")
    if problems:
        return "; ".join(problems)
    return None


def transformers_claims_bnb() -> bool:
    if importlib.util.find_spec("transformers") is None:
        return False
    from transformers.utils import import_utils

    return bool(import_utils.is_bitsandbytes_available())


def check_gate(ctx: Context) -> Metrics:
    declared = ctx.image_field("bitsandbytes")
    installed = importlib.util.find_spec("bitsandbytes") is not None
    metrics: Metrics = {"declared": declared or None, "installed": installed}
    if declared == "disabled":
        metrics["UNSLOTH_DISABLE_BITSANDBYTES"] = os.environ.get("UNSLOTH_DISABLE_BITSANDBYTES")
        reason = judge_disabled(
            bnb_installed=installed,
            transformers_claims=transformers_claims_bnb(),
            unsloth_installed=importlib.util.find_spec("unsloth") is not None,
            environ=os.environ,
        )
        require(reason, metrics)
        return metrics
    if not installed:
        if declared in ("index", "vendor"):
            msg = f"image declares bitsandbytes from {declared} but it is not installed"
            raise CheckFailed(msg, metrics)
        msg = "bitsandbytes is not installed and the image does not declare it"
        raise Skip(msg)
    metrics["version"] = str(getattr(_bnb(ctx), "__version__", "unknown"))
    return metrics


def _bnb(ctx: Context) -> ModuleType:
    return ctx.need_module("bitsandbytes")


def relative_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    out32, ref32 = out.float(), ref.float()
    return float(torch.linalg.vector_norm(out32 - ref32) / torch.linalg.vector_norm(ref32))


def judge_quantized(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> str | None:
    if not bool(torch.isfinite(out).all()):
        return "quantized matmul produced non-finite values"
    error = relative_rms(out, ref)
    if not error <= tolerance:
        return f"quantized matmul relative RMS error {error:.3g} exceeds {tolerance:g}"
    return None


def _quantized_layer(bnb: ModuleType, kind: str, weight: torch.Tensor) -> torch.nn.Module:
    out_features, in_features = weight.shape
    layer: torch.nn.Module
    if kind == "int8":
        layer = bnb.nn.Linear8bitLt(in_features, out_features, bias=False, has_fp16_weights=False)
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        layer = bnb.nn.Linear4bit(
            in_features, out_features, bias=False, compute_dtype=torch.float16, quant_type="nf4"
        )
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
    return layer


def check_matmul(ctx: Context, kind: str) -> Metrics:
    bnb = _bnb(ctx)
    tokens, k, n = SHAPE
    gen = torch.Generator(device=CPU).manual_seed(11)
    weight = torch.randn(n, k, generator=gen).half()
    x = torch.randn(tokens, k, generator=gen).half().to(ctx.device)
    # Moving the layer to the device is what quantizes its weight.
    layer = _quantized_layer(bnb, kind, weight).to(ctx.device)
    with torch.no_grad():
        out = layer(x)
    ref = x.float() @ weight.float().to(ctx.device).T
    metrics: Metrics = {"shape": list(SHAPE), "tolerance": TOLERANCE[kind]}
    if out.shape == ref.shape:
        metrics["relative_rms"] = relative_rms(out, ref)
    else:
        msg = f"output shape {list(out.shape)} != {list(ref.shape)}"
        raise CheckFailed(msg, metrics)
    require(judge_quantized(out, ref, TOLERANCE[kind]), metrics)
    return metrics
