"""Cross-checks of matrix cells: each rule on a failing and a passing input."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from stackpin.checks import Violation, check_cell, check_cells, excludes_numpy2
from stackpin.matrix import Cell, PinnedWheel, pinned_wheels
from stackpin.matrixfile import decode_matrix, load_cells

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHA = "0" * 64
M228 = "cp310-cp310-manylinux_2_28_x86_64"

DTK_CELL = f"""
schema_version = 1
[cells.dtk-test]
platform = "dtk"
platform_version = "26.04"
arch = ["gfx928"]
python = "cp310"
glibc = "2.35"
variants = ["stable", "enhanced"]
numpy = "<2"
bitsandbytes = "disabled"
env_script = "/opt/dtk/env.sh"

[cells.dtk-test.base]
image = "image.sourcefind.cn:5000/dcu/admin/base/pytorch:2.9.0-ubuntu22.04-dtk26.04-py3.10"
digest = "sha256:{SHA}"

[cells.dtk-test.torch]
filename = "torch-2.9.0+das.opt1.dtk2604-{M228}.whl"
sha256 = "{SHA}"

[cells.dtk-test.attention]
filename = "flash_attn-2.8.3+das.opt1.dtk2604.torch290-{M228}.whl"
sha256 = "{SHA}"

[cells.dtk-test.provided.torch]
version = "2.9.0+das.opt1.dtk2604"
requires = ["filelock"]

[cells.dtk-test.provided.flash-attn]
version = "2.8.3+das.opt1.dtk2604.torch290"
requires = ["torch", "einops"]

[cells.dtk-test.stack]
numpy = "1.26.4"
transformers = "4.57.6"
unsloth = "2026.10.9"

[cells.dtk-test.service]

[cells.dtk-test.env]
UNSLOTH_DISABLE_BITSANDBYTES = "1"
TRITON_HIP_LLD_PATH = "/opt/dtk/llvm/bin/ld.lld"
"""

CUDA_CELL = f"""
schema_version = 1
[cells.cuda-test]
platform = "cuda"
platform_version = "12.8"
python = "cp312"
glibc = "2.39"
variants = ["stable", "enhanced"]
numpy = "<3"

[cells.cuda-test.base]
image = "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"
digest = "sha256:{SHA}"

[cells.cuda-test.torch]
filename = "torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl"
sha256 = "{SHA}"
source = "index"

[cells.cuda-test.attention]
filename = "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
sha256 = "{SHA}"

[cells.cuda-test.stack]
numpy = "2.2.6"

[cells.cuda-test.provided.flash-attn]
version = "2.8.3+cu12torch2.8cxx11abiTRUE"
requires = ["torch", "einops"]
"""


def load(text: str) -> Cell:
    (cell,) = decode_matrix(tomllib.loads(text), source="test").cells.values()
    return cell


@pytest.fixture
def dtk() -> Cell:
    return load(DTK_CELL)


@pytest.fixture
def cuda() -> Cell:
    return load(CUDA_CELL)


def errors(cell: Cell) -> list[Violation]:
    return [v for v in check_cell(cell) if v.severity == "error"]


def warnings(cell: Cell) -> list[Violation]:
    return [v for v in check_cell(cell) if v.severity == "warning"]


def only_error(cell: Cell) -> Violation:
    found = errors(cell)
    assert len(found) == 1, [str(v) for v in found]
    return found[0]


def pin(filename: str, **kwargs: str) -> PinnedWheel:
    return PinnedWheel(filename=filename, sha256=SHA, **kwargs)


def replace(cell: Cell, **changes: object) -> Cell:
    """The cell with changes; a swapped vendor file brings its provided version along (the
    label rules are under test here, the provided/label agreement has its own tests)."""
    changed = dataclasses.replace(cell, **changes)
    provided = {}
    for _path, wheel in pinned_wheels(changed):
        dist, version = [*wheel.filename.split("-"), ""][:2]
        key = dist.replace("_", "-")
        if key in changed.provided:
            keep = version if version[:1].isdigit() else changed.provided[key].version
            provided[key] = dataclasses.replace(changed.provided[key], version=keep)
    return dataclasses.replace(changed, provided=provided)


def test_the_baseline_cells_are_clean(dtk, cuda):
    assert check_cell(dtk) == []
    assert check_cell(cuda) == []


# --- shipped matrices and the "done when" --------------------------------------


def test_shipped_matrices_have_no_errors_only_unpinned_warnings():
    cells = load_cells(sorted((ROOT / "pinning").glob("*.toml")))
    assert len(cells) >= 6
    found = check_cells(cells.values())
    assert [str(v) for v in found if v.severity == "error"] == []
    assert found, "vendor hashes are unpinned in the shipped matrices"
    # Only unpinned hashes, labels marked as placeholders (not seen on a real file) and the
    # one cell that cannot hold Studio, saying why (tests/unit/test_studio_cells.py).
    blocked = [v for v in found if v.field == "service"]
    assert [v.cell for v in blocked] == ["dtk2404-torch210-py310"]
    assert {v.found for v in found if not v.found.endswith("(placeholder)")
            and v not in blocked} == {"empty (unpinned)"}
    unpinned_wheels = sum(
        not w.sha256
        for c in cells.values()
        for w in (c.torch, *(() if c.attention is None else (c.attention,)), *c.vendor_wheels)
    )
    image_bases = sum(bool(c.base.image) and not c.base.digest for c in cells.values())
    placeholders = sum(p.placeholder for c in cells.values() for p in c.provided.values())
    assert len(found) == unpinned_wheels + image_bases + placeholders + len(blocked)


def test_broken_copy_of_dtk_matrix_reports_all_three_errors_in_one_call():
    cells = load_cells([FIXTURES / "dtk-broken.toml"])
    found = [v for v in check_cells(cells.values()) if v.severity == "error"]
    assert sorted((v.cell, v.field) for v in found) == [
        ("dtk2404-torch210-py310", "numpy"),
        ("dtk2604-bw-torch2100-py310", "vendor_wheels[0].filename"),
        ("dtk2604-k100-torch290-py310", "attention.filename"),
    ]
    text = "\n".join(map(str, found))
    assert "expected torch 2.9.0, found torch 2.8.0" in text
    assert "cp311-cp311" in text
    assert "for cp310" in text
    assert "numpy<3" in text


def test_violation_prints_one_line_with_cell_field_expected_found_fix():
    violation = Violation(
        cell="c1", field="attention.filename", expected="torch 2.9.0", found="torch 2.8.0",
        fix="choose another wheel",
    )
    assert str(violation) == (
        "c1: attention.filename: expected torch 2.9.0, found torch 2.8.0; choose another wheel"
    )
    assert violation.severity == "error"
    assert violation.to_json()["field"] == "attention.filename"


def test_all_violations_of_a_cell_are_returned_not_only_the_first(dtk):
    cell = replace(dtk, numpy="<3", env_script="", env={})
    assert {v.field for v in errors(cell)} == {
        "numpy", "env_script", "env.UNSLOTH_DISABLE_BITSANDBYTES",
    }


# --- python and platform tags ----------------------------------------------------------


def test_cp311_wheel_in_a_cp310_cell_fails(dtk):
    cell = replace(dtk, attention=pin(
        "flash_attn-2.8.3+das.opt1.dtk2604.torch290-cp311-cp311-manylinux_2_28_x86_64.whl"
    ))
    violation = only_error(cell)
    assert violation.field == "attention.filename"
    assert "cp310" in violation.expected
    assert "cp311-cp311" in violation.found


def test_abi3_and_pure_python_vendor_wheels_fit(dtk):
    cell = replace(dtk, vendor_wheels=(
        pin("lmslim-0.2.1+das.opt1.dtk2604-cp38-abi3-manylinux_2_28_x86_64.whl"),
        pin("hytools-1.0+das.dtk2604-py3-none-any.whl"),
    ))
    assert errors(cell) == []


def test_wheel_needing_a_newer_glibc_than_the_base_fails(dtk):
    cell = replace(dtk, torch=pin(
        "torch-2.9.0+das.opt1.dtk2604-cp310-cp310-manylinux_2_39_x86_64.whl"
    ))
    violation = only_error(cell)
    assert violation.field == "torch.filename"
    assert "glibc <= 2.35" in violation.expected
    assert "needs glibc 2.39" in violation.found


def test_wheel_for_another_cpu_arch_fails(dtk):
    cell = replace(dtk, torch=pin(
        "torch-2.9.0+das.opt1.dtk2604-cp310-cp310-manylinux_2_28_aarch64.whl"
    ))
    violation = only_error(cell)
    assert "x86_64" in violation.expected
    assert "aarch64" in violation.found


def test_unparsable_filename_is_an_error_and_the_other_rules_still_run(dtk):
    cell = replace(dtk, attention=pin("flash_attn-latest.whl"), numpy="<3")
    assert {v.field for v in errors(cell)} == {"attention.filename", "numpy"}


# --- versions in vendor labels ---------------------------------------------------------


def test_attention_label_for_another_torch_names_both_versions(dtk):
    cell = replace(dtk, attention=pin(f"flash_attn-2.8.3+das.opt1.dtk2604.torch280-{M228}.whl"))
    violation = only_error(cell)
    assert violation.field == "attention.filename"
    assert violation.expected == "torch 2.9.0"
    assert violation.found.startswith("torch 2.8.0 in the label of flash_attn-2.8.3")


def test_torch_2100_label_is_not_mistaken_for_2_1_0(dtk):
    cell = replace(
        dtk,
        torch=pin(f"torch-2.10.0+das.opt1.dtk2604-{M228}.whl"),
        attention=pin(f"flash_attn-2.8.3+das.opt1.dtk2604.torch2100-{M228}.whl"),
        base=dataclasses.replace(dtk.base, image=dtk.base.image.replace("2.9.0", "2.10.0")),
    )
    assert errors(cell) == []


def test_attention_label_for_another_dtk_names_both_versions(dtk):
    cell = replace(dtk, attention=pin(f"flash_attn-2.8.3+das.opt1.dtk2404.torch290-{M228}.whl"))
    violation = only_error(cell)
    assert violation.expected == "DTK 26.04"
    assert violation.found.startswith("DTK 24.04 in the label")


def test_dtk_point_release_is_not_the_base_release(dtk):
    cell = replace(dtk, vendor_wheels=(pin(f"torch_cluster-1.6.0+das.opt1.dtk26041-{M228}.whl"),))
    violation = only_error(cell)
    assert (violation.expected, violation.found.split(" in ")[0]) == ("DTK 26.04", "DTK 26.04.1")


def test_upstream_flash_attention_major_only_cuda_and_torch_fit(cuda):
    assert errors(cuda) == []


def test_cuda_label_for_another_cuda_minor_fails(cuda):
    cell = replace(cuda, attention=pin(
        "flash_attn-2.8.3+cu126torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    ))
    violation = only_error(cell)
    assert violation.expected == "CUDA 12.8"
    assert violation.found.startswith("CUDA 12.6")


def test_upstream_flash_attention_for_another_torch_fails(cuda):
    cell = replace(cuda, attention=pin(
        "flash_attn-2.8.3+cu12torch2.9cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    ))
    violation = only_error(cell)
    assert violation.expected == "torch 2.8.0"
    assert violation.found.startswith("torch 2.9 in the label")


def test_a_pure_python_attention_wheel_needs_no_torch_label(cuda):
    # FlashAttention 4 compiles its kernels at run time: no binary to build against a torch.
    cell = replace(cuda, attention=pin("flash_attn_4-4.0.0b36-py3-none-any.whl"))
    assert [v for v in check_cell(cell) if v.field == "attention.filename"] == []


def test_an_unlabelled_binary_attention_wheel_is_still_warned(cuda):
    # The shared sm_90 FA2 wheel: built against torch 2.11, and its name does not say so.
    cell = replace(cuda, attention=pin(
        "flash_attn-2.8.3.post2-cp312-cp312-linux_x86_64.whl"))
    (warning,) = [v for v in warnings(cell) if v.field == "attention.filename"]
    assert warning.expected.startswith("a label naming torch")


def test_rocm_wheel_on_a_dtk_cell_is_one_error(dtk):
    cell = replace(dtk, attention=pin(f"flash_attn-2.8.3+rocm6.4-{M228}.whl"))
    violation = only_error(cell)
    assert violation.expected == "a DTK 26.04 build"
    assert violation.found == "a ROCm 6.4 build (label rocm6.4)"


def test_das_wheel_on_a_cuda_cell_fails(cuda):
    cell = replace(cuda, attention=pin(
        "flash_attn-2.8.3+das.opt1.dtk2604.torch280-cp312-cp312-manylinux_2_28_x86_64.whl"
    ))
    violation = only_error(cell)
    assert violation.expected == "a CUDA 12.8 build"
    assert "DTK 26.04" in violation.found


def test_unlabelled_attention_wheel_on_dtk_is_an_error_other_vendor_wheels_a_warning(dtk):
    cell = replace(
        dtk,
        attention=pin(f"flash_attn-2.8.3-{M228}.whl"),
        vendor_wheels=(pin(f"lmslim-0.2.1-{M228}.whl"),),
    )
    assert [v.field for v in errors(cell)] == ["attention.filename"]
    assert "dtk2604" in errors(cell)[0].expected
    assert ("vendor_wheels[0].filename", "warning") in {
        (v.field, v.severity) for v in check_cell(cell)
    }


def test_unknown_label_tokens_are_shown_as_a_warning(dtk):
    filename = f"flash_attn-2.8.3+das.opt1.hcu3.dtk2604.torch290-{M228}.whl"
    cell = replace(dtk, attention=pin(filename))
    assert errors(cell) == []
    (warning,) = warnings(cell)
    assert warning.field == "attention.filename"
    assert "hcu3" in warning.found


# --- the torch wheel's own label -------------------------------------------------------


def test_public_index_torch_on_a_dtk_cell_fails(dtk):
    violation = only_error(replace(dtk, torch=pin(f"torch-2.9.0-{M228}.whl")))
    assert violation.field == "torch.filename"
    assert "dtk2604" in violation.expected
    assert "no local label" in violation.found
    assert "no DCU backend" in violation.fix


def test_das_torch_for_another_dtk_fails(dtk):
    violation = only_error(replace(dtk, torch=pin(f"torch-2.9.0+das.opt1.dtk2404-{M228}.whl")))
    assert (violation.field, violation.expected) == ("torch.filename", "DTK 26.04")


@pytest.mark.parametrize(
    ("platform", "version", "label", "ok"),
    [
        ("cpu", "", "+cpu", True),
        ("cpu", "", "+cu128", False),
        ("cpu", "", "", False),
        ("rocm", "6.4", "+rocm6.4", True),
        ("rocm", "6.4", "", False),
        ("rocm", "6.4", "+rocm6.3", False),
        ("cuda", "12.8", "", True),
        ("cuda", "12.8", "+cu128", True),
        ("cuda", "12.8", "+rocm6.4", False),
        ("cuda", "12.8", "+cpu", False),
    ],
)
def test_torch_label_agrees_with_the_platform(cuda, platform, version, label, ok):
    cell = replace(
        cuda, platform=platform, platform_version=version, variants=("stable",), attention=None,
        torch=pin(f"torch-2.8.0{label}-cp312-cp312-manylinux_2_28_x86_64.whl"),
    )
    assert [v.field for v in errors(cell)] == ([] if ok else ["torch.filename"])


def test_torch_slot_holding_another_distribution_fails(cuda):
    cell = replace(cuda, torch=pin("numpy-2.2.6-cp312-cp312-manylinux_2_28_x86_64.whl"))
    assert "torch.filename" in {v.field for v in errors(cell)}


# --- numpy -----------------------------------------------------------------------------


def test_numpy_below_3_on_a_dtk_cell_fails(dtk):
    violation = only_error(replace(dtk, numpy="<3"))
    assert violation.field == "numpy"
    assert violation.found == "numpy<3"
    assert "<2" in violation.fix


def test_numpy_2_allowed_with_old_torch_fails_even_off_dtk(cuda):
    cell = replace(
        cuda, variants=("stable",), attention=None, stack={"numpy": "1.26.4"},
        torch=pin("torch-2.1.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
    )
    violation = only_error(cell)
    assert violation.field == "numpy"
    assert "2.1.0" in violation.fix


def test_numpy_2_allowed_with_torch_2_3_or_newer_off_dtk(cuda):
    assert errors(replace(cuda, numpy=">=1.26,<3")) == []


@pytest.mark.parametrize(
    ("constraint", "excludes"),
    [
        ("<2", True),
        ("<2.0", True),
        ("<=1.26.4", True),
        ("==1.26.*", True),
        ("==1.26.4", True),
        ("~=1.26", True),
        (">=1.22,<2", True),
        ("<3", False),
        ("<2.1", False),
        ("<2.0.0rc2", False),
        ("<=2.0", False),
        (">=1.22", False),
        ("!=2.*", False),
        ("==2.*", False),
        ("~=2.0", False),
    ],
)
def test_excludes_numpy2(constraint, excludes):
    assert excludes_numpy2(SpecifierSet(constraint)) is excludes


def test_invalid_numpy_constraint_fails(dtk):
    violation = only_error(replace(dtk, numpy="less than two"))
    assert violation.field == "numpy"


def test_stack_numpy_outside_the_constraint_fails(dtk):
    violation = only_error(replace(dtk, stack={**dtk.stack, "numpy": "2.0.2"}))
    assert violation.field == "stack.numpy"
    assert violation.expected == "a numpy version satisfying numpy<2"
    assert violation.found == "numpy 2.0.2"


# --- variants, bitsandbytes, environment, stack ---------------------------------------


def test_attention_wheel_without_the_enhanced_variant_fails(dtk):
    violation = only_error(replace(dtk, variants=("stable",)))
    assert violation.field == "attention"
    assert "enhanced" in violation.fix


def test_enhanced_variant_without_an_attention_wheel_fails(dtk):
    violation = only_error(replace(dtk, attention=None))
    assert violation.field == "variants"


def test_stable_only_cell_without_attention_passes(dtk):
    assert errors(replace(dtk, variants=("stable",), attention=None)) == []


def test_bitsandbytes_from_the_index_on_dtk_fails(dtk):
    cell = replace(dtk, bitsandbytes="index", stack={**dtk.stack, "bitsandbytes": "0.47.0"})
    assert {v.field for v in errors(cell)} == {"bitsandbytes", "stack.bitsandbytes"}


@pytest.mark.parametrize("env", [{}, {"UNSLOTH_DISABLE_BITSANDBYTES": "0"}])
def test_dtk_cell_must_disable_bitsandbytes_in_the_environment(dtk, env):
    violation = only_error(replace(dtk, env=env))
    assert violation.field == "env.UNSLOTH_DISABLE_BITSANDBYTES"
    assert violation.expected == "'1'"


def test_vendor_bitsandbytes_wheel_lifts_the_dtk_rule(dtk):
    cell = replace(
        dtk, bitsandbytes="vendor", env={},
        vendor_wheels=(pin(f"bitsandbytes-0.43.0+das.opt1.dtk2604-{M228}.whl"),),
    )
    assert errors(cell) == []


def test_bitsandbytes_vendor_without_a_vendor_wheel_fails(cuda):
    violation = only_error(replace(cuda, bitsandbytes="vendor"))
    assert violation.field == "bitsandbytes"


def test_dtk_cell_without_env_script_fails(dtk, cuda):
    assert only_error(replace(dtk, env_script="")).field == "env_script"
    assert errors(replace(cuda, env_script="")) == []


def test_triton_lld_path_must_name_ld_lld(dtk):
    cell = replace(dtk, env={**dtk.env, "TRITON_HIP_LLD_PATH": "/opt/dtk/llvm/bin/lld"})
    violation = only_error(cell)
    assert violation.field == "env.TRITON_HIP_LLD_PATH"
    assert "PassManager::run failed" in violation.fix


def test_torch_in_the_stack_table_fails(dtk):
    violation = only_error(replace(dtk, stack={**dtk.stack, "torch": "2.9.0"}))
    assert violation.field == "stack.torch"


def test_vendor_wheel_dist_in_the_stack_table_fails_by_normalized_name(dtk):
    cell = replace(
        dtk,
        vendor_wheels=(pin(f"vllm-0.11.0+das.opt1.dtk2604.torch290-{M228}.whl"),),
        stack={**dtk.stack, "vLLM": "0.11.0", "flash-attn": "2.8.3"},
    )
    assert {v.field for v in errors(cell)} == {"stack.vLLM", "stack.flash-attn"}


# --- base image ------------------------------------------------------------------------


def test_sourcefind_base_tag_must_agree_with_dtk_python_and_torch(dtk):
    image = "image.sourcefind.cn:5000/dcu/admin/base/pytorch:2.4.1-ubuntu22.04-dtk25.04-py3.11"
    cell = replace(dtk, base=dataclasses.replace(dtk.base, image=image))
    found = {(v.expected, v.found) for v in errors(cell)}
    assert found == {
        ("dtk26.04 in the tag", "dtk25.04"),
        ("py3.10 in the tag", "py3.11"),
        ("pytorch 2.9.0 in the tag (the pinned torch)", "pytorch 2.4.1"),
    }


def test_non_pytorch_sourcefind_base_is_not_compared_with_torch(dtk):
    image = "image.sourcefind.cn:5000/dcu/admin/base/vllm:0.9.2-ubuntu22.04-dtk26.04-py3.10"
    assert errors(replace(dtk, base=dataclasses.replace(dtk.base, image=image))) == []


def test_dtk_base_on_a_cuda_cell_fails(cuda, dtk):
    violation = only_error(replace(cuda, base=dtk.base))
    assert violation.field == "base.image"
    assert "DTK 26.04" in violation.found


# --- unpinned hashes -------------------------------------------------------------------


def test_unpinned_vendor_wheel_warns_with_the_sha256sum_command(dtk):
    filename = dtk.torch.filename
    cell = replace(dtk, torch=dataclasses.replace(dtk.torch, sha256=""))
    assert errors(cell) == []
    (warning,) = warnings(cell)
    assert (warning.field, warning.found) == ("torch.sha256", "empty (unpinned)")
    assert f"sha256sum wheels/vendor/{filename}" in warning.fix


def test_unpinned_index_wheel_warns_with_the_fetch_command(cuda):
    cell = replace(cuda, torch=dataclasses.replace(cuda.torch, sha256=""))
    (warning,) = warnings(cell)
    assert f"stackpin wheels fetch {cuda.id}" in warning.fix


def test_unpinned_image_base_warns_but_a_bootstrap_base_does_not():
    cpu = load_cells([ROOT / "pinning" / "cpu.toml"])["cpu-bookworm-torch2130-py311"]
    assert cpu.base.bootstrap is not None
    assert check_cell(cpu) == []
    dtk = load(DTK_CELL)
    cell = replace(dtk, base=dataclasses.replace(dtk.base, digest=""))
    (warning,) = warnings(cell)
    assert warning.field == "base.digest"
    assert "docker image inspect" in warning.fix
