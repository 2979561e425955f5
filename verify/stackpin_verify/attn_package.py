"""The image's attention package, found at run time (the enhanced variant's one addition).

Two packages provide ``flash_attn``: FlashAttention 2 (distribution ``flash-attn``,
``flash_attn.flash_attn_func``) and FlashAttention 4 (distribution ``flash-attn-4``, CuTe DSL,
``flash_attn.cute.flash_attn_func``). FA2 wheels ship a ``cute`` folder too, so the module
alone cannot tell them apart: the installed distribution decides, as in transformers'
``is_flash_attn_4_available``. FA4 is tried first, the package transformers picks when both
are present.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stackpin_verify.checks import CheckFailed, Skip

# (distribution, module holding flash_attn_func, what a person calls it), in preference order.
CANDIDATES = (
    ("flash-attn-4", "flash_attn.cute", "FlashAttention 4"),
    ("flash-attn", "flash_attn", "FlashAttention 2"),
)

ImportModule = Callable[[str], Any]
DistVersion = Callable[[str], str]


class PackageBroken(Exception):
    """The distribution is installed but its attention function cannot be imported."""


@dataclass(frozen=True)
class AttentionPackage:
    dist: str
    version: str
    module: str
    title: str
    func: Callable[..., Any]

    @property
    def label(self) -> str:
        return f"{self.dist} {self.version} ({self.title})"

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        softmax_scale: float | None = None,
    ) -> torch.Tensor:
        """Attention on [B, S, H, D] (KV heads may be fewer: both packages do GQA)."""
        out = self.func(q, k, v, causal=causal, softmax_scale=softmax_scale)
        # FA4's flash_attn_func returns (out, lse); FA2's the output alone.
        result: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return result


def discover(
    import_module: ImportModule = importlib.import_module,
    dist_version: DistVersion = importlib.metadata.version,
) -> AttentionPackage | None:
    """The first installed candidate, None when neither is; PackageBroken when one is
    installed and its function does not import (the enhanced variant cannot run)."""
    for dist, module, title in CANDIDATES:
        try:
            # None where the dist-info holds no METADATA (a half-copied install).
            version = dist_version(dist) or "(no version in its metadata)"
        except importlib.metadata.PackageNotFoundError:
            continue
        try:
            func = import_module(module).flash_attn_func
        except Exception as exc:
            msg = (
                f"{dist} {version} is installed but {module}.flash_attn_func does not "
                f"import: {type(exc).__name__}: {exc}"
            )
            raise PackageBroken(msg) from exc
        return AttentionPackage(dist, version, module, title, func)
    return None


def for_timing(
    image_attention: str, no_package: str, find: Callable[[], AttentionPackage | None] = discover
) -> AttentionPackage:
    """The package to time against SDPA. ``image_attention`` is image.json's module
    (``flash_attn``, ``flash_attn.cute``; ``sdpa`` or empty for none). An image that declares
    one and holds no working one, or another, fails on the enhanced side; an image without
    one (stable) has nothing to time, which ``no_package`` says."""
    declared = image_attention not in ("", "sdpa")
    try:
        package = find()
    except PackageBroken as exc:
        raise CheckFailed(str(exc), {"failed_side": "enhanced"}) from exc
    if package is None and not declared:
        raise Skip(no_package)
    if package is None:
        msg = f"the image's attention is {image_attention} but no FlashAttention is installed"
        raise CheckFailed(msg, {"failed_side": "enhanced"})
    if declared and package.module != image_attention:
        msg = f"the image's attention is {image_attention} but the installed one is {package.label}"
        raise CheckFailed(msg, {"failed_side": "enhanced", "package": package.label})
    return package
