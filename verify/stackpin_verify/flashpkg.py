"""The attention package behind one interface: FlashAttention 2 (``flash_attn``) or 4
(``flash_attn.cute``, the CuTe DSL build that compiles its kernels on first use).

Both take [B, S, H, D] tensors and the same keywords (``causal``, ``cu_seqlens_q``,
``cu_seqlens_k``, ``max_seqlen_q``, ``max_seqlen_k``); FlashAttention 4 returns
``(out, lse)`` where 2 returns ``out``. The levels call the functions of the module this
returns and never need to know which one the image holds.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import types
from collections.abc import Callable
from typing import Any

from stackpin_verify import attn_package

# Import name -> distribution, from the one table of attention packages (attn_package).
PACKAGES = {module: dist for dist, module, _title in attn_package.CANDIDATES}


def declared(attention: str) -> bool:
    """Whether an image's declared attention is an attention package (not sdpa)."""
    return attention in PACKAGES


def installed(name: str) -> bool:
    """Whether the distribution behind module ``name`` is installed (FA2 wheels ship a
    ``cute`` folder too, so the module alone cannot tell the packages apart)."""
    try:
        importlib.metadata.version(PACKAGES[name])
    except (importlib.metadata.PackageNotFoundError, KeyError):
        return False
    return True


def discover(attention: str) -> str | None:
    """The module to use: the declared one, else the first installed candidate (a bare GPU
    host), in attn_package's order of preference."""
    if declared(attention):
        return attention
    return next((module for module in PACKAGES if installed(module)), None)


def _out(result: Any) -> Any:
    return result[0] if isinstance(result, tuple) else result


def _unwrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return _out(fn(*args, **kwargs))

    return call


_VARLEN_POSITIONAL = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def _varlen(fn: Callable[..., Any]) -> Callable[..., Any]:
    """FlashAttention 2's positional varlen call, by keyword: FlashAttention 4 takes ``qv``
    fourth, so ``f(q, k, v, cu_q, cu_k, max_q, max_k)`` would hand it the offsets as qv."""
    def call(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(_VARLEN_POSITIONAL):
            msg = f"flash_attn_varlen_func takes {len(_VARLEN_POSITIONAL)} positional offsets"
            raise TypeError(msg)
        kwargs.update(zip(_VARLEN_POSITIONAL, args, strict=False))
        return _out(fn(q, k, v, **kwargs))

    return call


def load(name: str) -> types.ModuleType:
    """The package as a module with ``flash_attn_func``, ``flash_attn_varlen_func`` and
    ``__version__`` (the distribution's), each function returning the output only."""
    module = importlib.import_module(name)
    api = types.ModuleType(f"stackpin_verify.flashpkg[{name}]")
    api.flash_attn_func = _unwrap(module.flash_attn_func)  # type: ignore[attr-defined]
    api.flash_attn_varlen_func = _varlen(  # type: ignore[attr-defined]
        module.flash_attn_varlen_func)
    try:
        api.__version__ = importlib.metadata.version(PACKAGES[name])  # type: ignore[attr-defined]
    except importlib.metadata.PackageNotFoundError:
        api.__version__ = str(getattr(module, "__version__", "unknown"))  # type: ignore[attr-defined]
    api.package = name  # type: ignore[attr-defined]
    return api
