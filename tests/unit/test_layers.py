"""The install layers (stackpin.layers): every locked wheel in exactly one layer, the
stack split by compiled code, the lock itself untouched."""

from __future__ import annotations

import pytest
from tests.conftest import CPU_CELL, CUDA_CELL, ROOT

from stackpin.layers import LAYERS, install_layers, is_pure, layer_of, stack_pins
from stackpin.lock import LockedWheel, read_lock


@pytest.mark.parametrize(("filename", "pure"), [
    ("peft-0.17.1-py3-none-any.whl", True),
    ("six-1.17.0-py2.py3-none-any.whl", True),
    ("numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", False),
    ("uv-0.13.8-py3-none-manylinux_2_17_x86_64.whl", False),  # a binary without an ABI
    ("pydantic_core-2.41.5-cp311-abi3-any.whl", False),
    ("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", False),
    ("builder-1.0-1build-py3-none-any.whl", True),  # a build tag: the tags are the last three
])
def test_pure_means_no_abi_and_any_platform_in_every_tag(filename: str, pure: bool):
    assert is_pure(filename) is pure


def _wheel(name: str, filename: str, group: str) -> LockedWheel:
    return LockedWheel(name=name, version="1", filename=filename, sha256="0" * 64,
                       group=group, source="index")  # type: ignore[arg-type]


def test_only_the_stack_is_split_by_code_and_by_the_cells_pins():
    pins = frozenset({"peft"})
    assert layer_of(_wheel("peft", "peft-1-py3-none-any.whl", "stack"), pins) == "pinned"
    assert layer_of(_wheel("a", "a-1-py3-none-any.whl", "stack"), pins) == "pure"
    assert layer_of(_wheel("b", "b-1-cp311-cp311-linux_x86_64.whl", "stack"), pins) == "stack"
    # A pinned wheel with compiled code stays below: it is large, and rarely the one bumped.
    assert layer_of(_wheel("peft", "peft-1-cp311-cp311-linux_x86_64.whl", "stack"),
                    pins) == "stack"
    # A pure vendor or attention wheel stays in its group's layer: order is the boundary's.
    assert layer_of(_wheel("v", "v-1-py3-none-any.whl", "vendor"), pins) == "vendor"
    assert layer_of(_wheel("f", "f-1-py3-none-any.whl", "attention"), pins) == "attention"
    with pytest.raises(ValueError, match="provided by the base image"):
        layer_of(_wheel("n", "", "base"), pins)


@pytest.mark.parametrize("cell_id", [CPU_CELL, CUDA_CELL])
def test_every_installed_wheel_is_in_exactly_one_layer_in_install_order(cell_id, shipped_cells):
    lock = read_lock(ROOT, cell_id)
    assert lock is not None
    cell = shipped_cells[cell_id]
    for variant in cell.variants:
        layers = install_layers(cell, variant, lock)
        names = [layer.name for layer in layers]
        assert names == [n for n in LAYERS if n in names]
        placed = [w for layer in layers for w in layer.wheels]
        assert len(placed) == len(set(placed))
        installed = {w for w in lock.wheels if w.group != "base"
                     and (w.group != "attention" or variant == "enhanced")}
        assert set(placed) == installed
        by_name = {layer.name: layer.wheels for layer in layers}
        pins = stack_pins(cell)
        assert by_name["pure"] and all(is_pure(w.filename) and w.name not in pins
                                       for w in by_name["pure"])
        assert by_name["pinned"] and all(is_pure(w.filename) and w.name in pins
                                         for w in by_name["pinned"])
        assert by_name["stack"] and not any(is_pure(w.filename) for w in by_name["stack"])
        assert {"transformers", "peft", "unsloth"} <= {w.name for w in by_name["pinned"]}
        assert {"sympy", "networkx"} <= {w.name for w in by_name["pure"]}
