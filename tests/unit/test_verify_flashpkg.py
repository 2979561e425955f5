"""The attention package behind one interface: FA2's positional varlen call reaches
FlashAttention 4 by keyword (its fourth parameter is qv), and FA4's (out, lse) is unwrapped.

The H200 replay's first enhanced run failed every varlen case on exactly this (the offsets
landed in qv); these tests hold the mapping with a stand-in that has FA4's signature.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import verify_helpers  # noqa: F401 - puts verify/ on the path

from stackpin_verify import flashpkg


def fa4_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """A flash_attn namespace holding only cute, with FA4's keyword signature."""
    calls: list[dict[str, object]] = []
    cute = tmp_path / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "__init__.py").write_text(
        "CALLS = []\n"
        "def flash_attn_func(q, k, v, qv=None, softmax_scale=None, causal=False):\n"
        "    CALLS.append({'qv': qv, 'causal': causal})\n"
        "    return ('out', 'lse')\n"
        "def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None,\n"
        "                           max_seqlen_q=None, max_seqlen_k=None, causal=False):\n"
        "    CALLS.append({'qv': qv, 'cu_q': cu_seqlens_q, 'cu_k': cu_seqlens_k,\n"
        "                  'max_q': max_seqlen_q, 'max_k': max_seqlen_k, 'causal': causal})\n"
        "    return ('out', None)\n")
    info = tmp_path / "flash_attn_4-4.0.0b36.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-attn-4\nVersion: 4.0.0b36\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    return calls


def test_fa4_is_found_by_its_distribution(tmp_path, monkeypatch) -> None:
    fa4_like(tmp_path, monkeypatch)
    assert flashpkg.discover("sdpa") == "flash_attn.cute"
    assert flashpkg.discover("flash_attn.cute") == "flash_attn.cute"


def test_fa2_positional_varlen_reaches_fa4_by_keyword(tmp_path, monkeypatch) -> None:
    fa4_like(tmp_path, monkeypatch)
    api = flashpkg.load("flash_attn.cute")
    assert api.flash_attn_varlen_func("q", "k", "v", "cu_q", "cu_k", 7, 9, causal=True) == "out"
    recorded = sys.modules["flash_attn.cute"].CALLS[-1]
    assert recorded == {"qv": None, "cu_q": "cu_q", "cu_k": "cu_k", "max_q": 7, "max_k": 9,
                        "causal": True}
    assert api.flash_attn_func("q", "k", "v", causal=False) == "out"  # (out, lse) unwrapped
    with pytest.raises(TypeError, match="4 positional offsets"):
        api.flash_attn_varlen_func("q", "k", "v", 1, 2, 3, 4, 5)


def test_a_declared_package_that_is_absent_is_not_found(monkeypatch) -> None:
    monkeypatch.setattr(flashpkg, "installed", lambda _name: False)
    assert flashpkg.discover("sdpa") is None
    # The declaration decides which package is meant, even when it is absent: L3 then
    # fails on it instead of quietly testing another one.
    assert flashpkg.discover("flash_attn") == "flash_attn"
