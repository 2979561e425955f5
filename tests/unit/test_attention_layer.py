"""The enhanced variant's layer: the attention package, its extras, and what only it pulls in.

FlashAttention 4 brings a whole closure of its own (the CuTe DSL, quack-kernels, tvm-ffi):
that closure must sit in the attention layer, so the stable image never carries it and both
variants share every layer below it; a distribution something else needs stays below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackpin.context import read_sources
from stackpin.lock import lock_from_resolution, read_lock
from stackpin.matrix import Variant
from stackpin.matrixfile import load_cells
from stackpin.render import RenderRequest, declared_imports, image_info
from stackpin.resolve import (
    Resolution,
    Resolved,
    _requirements,
    attention_only,
    index_extras,
    resolution_key,
)

ROOT = Path(__file__).resolve().parents[2]
CELL_TOML = """\
schema_version = 1
[cells.fa4]
platform = "cuda"
platform_version = "13.0"
arch = ["sm_90"]
python = "cp311"
glibc = "2.36"
variants = ["stable", "enhanced"]
numpy = "<3"
[cells.fa4.base]
image = "example.invalid/base:1"
[cells.fa4.torch]
filename = "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
sha256 = "{sha}"
source = "index"
[cells.fa4.attention]
filename = "flash_attn_4-4.0.0b36-py3-none-any.whl"
sha256 = "{sha}"
source = "index"
{extras}
[cells.fa4.stack]
unsloth = "2026.10.9"
"""


def cell(tmp_path: Path, extras: str = 'extras = ["cu13"]'):
    path = tmp_path / "m.toml"
    path.write_text(CELL_TOML.format(sha="ab" * 32, extras=extras))
    return load_cells([path])["fa4"]


def entry(name: str, *requires: str) -> Resolved:
    return Resolved(name=name, version="1", origin="index", filename=f"{name}-1-py3-none-any.whl",
                    url=f"https://files.example.invalid/{name}", sha256="cd" * 32,
                    requires=requires)


CLOSURE = (
    entry("torch", "einops"),
    entry("unsloth", "torch", "einops"),
    entry("einops"),
    entry("flash-attn-4", "torch", "einops", "nvidia-cutlass-dsl",
          'nvidia-cutlass-dsl[cu13]; extra == "cu13"'),
    entry("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
          'nvidia-cutlass-dsl-libs-cu13; extra == "cu13"'),
    entry("nvidia-cutlass-dsl-libs-base"),
    entry("nvidia-cutlass-dsl-libs-cu13"),
)


def test_what_only_the_attention_package_needs_is_its_layer(tmp_path: Path) -> None:
    fa4 = cell(tmp_path)
    assert attention_only(fa4, CLOSURE) == {
        "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
        "nvidia-cutlass-dsl-libs-cu13"}
    lock = lock_from_resolution(fa4, Resolution(cell="fa4", key="k", closure=CLOSURE),
                                base_reference="b")
    groups = {w.name: w.group for w in lock.wheels}
    # einops is needed by torch and unsloth too: it stays below, shared by both variants.
    assert groups["einops"] == "stack"
    assert groups["torch"] == "vendor"
    assert groups["nvidia-cutlass-dsl-libs-cu13"] == "attention"


def test_a_stable_only_cell_has_no_attention_layer(tmp_path: Path) -> None:
    text = (tmp_path / "x.toml")
    text.write_text(CELL_TOML.format(sha="ab" * 32, extras="").replace(
        'variants = ["stable", "enhanced"]', 'variants = ["stable"]'))
    assert attention_only(load_cells([text])["fa4"], CLOSURE) == set()


def test_extras_reach_pip_and_the_resolution_key(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with_extras, without = cell(tmp_path), cell(tmp_path / "plain", extras="")
    assert index_extras(with_extras) == {"flash-attn-4": ("cu13",)}
    assert index_extras(without) == {}
    pinned = {"flash-attn-4": "4.0.0b36", "torch": "2.11.0"}
    lines = _requirements(with_extras, pinned, {}, tmp_path, {})
    assert "flash-attn-4[cu13]==4.0.0b36" in lines
    assert "torch==2.11.0" in lines
    assert "flash-attn-4==4.0.0b36" in _requirements(without, pinned, {}, tmp_path, {})
    # The extra decides the closure, so it is part of the key; no extras, no key change.
    assert resolution_key(with_extras) != resolution_key(without)


def test_a_wheel_without_extras_keeps_its_cell_digest() -> None:
    # The shipped locks were made before extras existed: they must still be current.
    from stackpin.lock import cell_digest

    cells = load_cells(sorted((ROOT / "pinning").glob("*.toml")))
    for cell_id, shipped in cells.items():
        lock = read_lock(ROOT, cell_id)
        assert lock.cell_digest == cell_digest(shipped), cell_id


@pytest.fixture(scope="module")
def cuda() -> tuple[object, object]:
    cells = load_cells([ROOT / "pinning" / "cuda.toml"])
    (cell_id,) = cells
    return cells[cell_id], read_lock(ROOT, cell_id)


def test_shipped_cuda_cell_puts_fa4s_closure_in_enhanced_only(cuda) -> None:
    cuda_cell, lock = cuda
    attention = {w.name for w in lock.group("attention")}
    assert {"flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13",
            "quack-kernels", "apache-tvm-ffi"} <= attention
    assert "torch" not in attention and "einops" not in attention
    stable = image_info(RenderRequest(cell=cuda_cell, variant=Variant.STABLE, lock=lock, sources=read_sources(ROOT / "templates"), stackpin_version="0"))
    enhanced = image_info(RenderRequest(cell=cuda_cell, variant=Variant.ENHANCED, lock=lock, sources=read_sources(ROOT / "templates"), stackpin_version="0"))
    # The stable image is checked against what it installs, not against the enhanced layer.
    assert not attention & set(stable["pins"])
    assert attention <= set(enhanced["pins"])
    assert stable["imports"] == ["torch", "triton", "bitsandbytes", "unsloth"]
    assert enhanced["imports"] == [*stable["imports"], "flash_attn.cute"]
    assert json.dumps(enhanced["attention"]) == '"flash_attn.cute"'


def test_declared_imports_follow_the_pins(cuda) -> None:
    cuda_cell, _lock = cuda
    assert declared_imports(cuda_cell, Variant.STABLE, {"torch": "1"}) == ["torch"]
    assert declared_imports(cuda_cell, Variant.ENHANCED, {"torch": "1", "unsloth": "2"}) == [
        "torch", "unsloth", "flash_attn.cute"]


def test_the_attention_table_is_the_same_on_both_sides_of_the_image():
    # render writes the module an attention distribution is imported as into image.json;
    # verify/ (which never imports stackpin) finds the package by the same pairs.
    import verify_helpers  # noqa: F401 - puts verify/ on the path

    from stackpin.render import ATTENTION_MODULES
    from stackpin_verify.attn_package import CANDIDATES

    assert {dist: module for dist, module, _title in CANDIDATES} == ATTENTION_MODULES
