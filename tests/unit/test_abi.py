"""Wheel filename and label parsing: every label form seen in the field, tags, glibc."""

from __future__ import annotations

import pytest

from stackpin.abi import (
    glibc_floor,
    parse_wheel_filename,
    platform_fits,
    python_tag_fits,
)
from stackpin.errors import ValidationError
from stackpin.platforms import BaseTag, base_tag

M228 = "cp310-cp310-manylinux_2_28_x86_64"


def fields(filename: str) -> dict[str, object]:
    return parse_wheel_filename(filename).to_json()


def test_json_keys_are_the_public_contract():
    # A JSON object's keys: their set is the contract (`--json` prints them sorted).
    assert sorted(fields(f"torch-2.9.0+das.opt1.dtk2604-{M228}.whl")) == sorted([
        "dist", "version", "local", "python_tag", "abi_tag", "platform_tag", "glibc",
        "vendor", "dtk", "torch", "cuda", "rocm", "cxx11abi", "unknown_tokens",
    ])


def test_das_attention_label_with_dtk_and_compact_torch():
    assert fields(f"flash_attn-2.8.3+das.opt1.dtk2604.torch290-{M228}.whl") == {
        "dist": "flash_attn",
        "version": "2.8.3+das.opt1.dtk2604.torch290",
        "local": "das.opt1.dtk2604.torch290",
        "python_tag": "cp310",
        "abi_tag": "cp310",
        "platform_tag": "manylinux_2_28_x86_64",
        "glibc": "2.28",
        "vendor": "das",
        "dtk": "26.04",
        "torch": "2.9.0",
        "cuda": None,
        "rocm": None,
        "cxx11abi": None,
        "unknown_tokens": [],
    }


def test_das_torch_label_with_build_date_and_git_hash():
    name = f"torch-2.11.0+das185.dtk2604.torch2110.202510021530.g1a2b3c4-{M228}.whl"
    info = parse_wheel_filename(name)
    assert info.to_json() == {
        "dist": "torch",
        "version": "2.11.0+das185.dtk2604.torch2110.202510021530.g1a2b3c4",
        "local": "das185.dtk2604.torch2110.202510021530.g1a2b3c4",
        "python_tag": "cp310",
        "abi_tag": "cp310",
        "platform_tag": "manylinux_2_28_x86_64",
        "glibc": "2.28",
        "vendor": "das",
        "dtk": "26.04",
        "torch": "2.11.0",
        "cuda": None,
        "rocm": None,
        "cxx11abi": None,
        "unknown_tokens": [],
    }
    assert [(t.kind, t.value) for t in info.tokens] == [
        ("das", "185"), ("dtk", "2604"), ("torch", "2110"),
        ("date", "202510021530"), ("git", "1a2b3c4"),
    ]


def test_das_point_release_dtk_and_compressed_platform_tag():
    name = (
        "torch_cluster-1.6.0+das.opt1.dtk24043"
        "-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    )
    assert fields(name) == {
        "dist": "torch_cluster",
        "version": "1.6.0+das.opt1.dtk24043",
        "local": "das.opt1.dtk24043",
        "python_tag": "cp310",
        "abi_tag": "cp310",
        "platform_tag": "manylinux_2_17_x86_64.manylinux2014_x86_64",
        "glibc": "2.17",
        "vendor": "das",
        "dtk": "24.04.3",
        "torch": None,
        "cuda": None,
        "rocm": None,
        "cxx11abi": None,
        "unknown_tokens": [],
    }


def test_das_release_with_git_and_abi_tokens():
    info = parse_wheel_filename(
        "torch-2.1.0+das1.1.git3ac1bdd.abi1.dtk2404-cp310-cp310-manylinux_2_31_x86_64.whl"
    )
    assert info.to_json() == {
        "dist": "torch",
        "version": "2.1.0+das1.1.git3ac1bdd.abi1.dtk2404",
        "local": "das1.1.git3ac1bdd.abi1.dtk2404",
        "python_tag": "cp310",
        "abi_tag": "cp310",
        "platform_tag": "manylinux_2_31_x86_64",
        "glibc": "2.31",
        "vendor": "das",
        "dtk": "24.04",
        "torch": "2.1.0",  # the torch wheel's own public version
        "cuda": None,
        "rocm": None,
        "cxx11abi": None,
        "unknown_tokens": [],
    }
    assert [t.kind for t in info.tokens] == ["das", "git", "abi", "dtk"]


def test_das_torch_wheel_without_torch_token_reports_its_own_version():
    info = parse_wheel_filename(f"torch-2.9.0+das.opt1.dtk2604-{M228}.whl")
    assert (info.version, info.local, info.names_version("dtk"), info.torch, info.vendor) == (
        "2.9.0+das.opt1.dtk2604", "das.opt1.dtk2604", "26.04", "2.9.0", "das",
    )


def test_upstream_flash_attention_label_with_cxx11abi():
    name = "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
    assert fields(name) == {
        "dist": "flash_attn",
        "version": "2.8.3+cu12torch2.8cxx11abiTRUE",
        "local": "cu12torch2.8cxx11abiTRUE",
        "python_tag": "cp312",
        "abi_tag": "cp312",
        "platform_tag": "linux_x86_64",
        "glibc": None,
        "vendor": "cuda",
        "dtk": None,
        "torch": "2.8",
        "cuda": "12",
        "rocm": None,
        "cxx11abi": True,
        "unknown_tokens": [],
    }


def test_upstream_flash_attention_label_cxx11abi_false():
    name = "flash_attn-2.8.3+cu12torch2.7cxx11abiFALSE-cp311-cp311-linux_x86_64.whl"
    info = parse_wheel_filename(name)
    assert (info.names_version("cuda"), info.torch, info.cxx11abi) == ("12", "2.7", False)


def test_upstream_flash_attention_label_with_cuda_minor():
    info = fields("flash_attn-2.8.3+cu128torch2.9-cp312-cp312-linux_x86_64.whl")
    assert (info["vendor"], info["cuda"], info["torch"], info["cxx11abi"]) == (
        "cuda", "12.8", "2.9", None,
    )
    assert info["unknown_tokens"] == []


@pytest.mark.parametrize(
    ("label", "vendor", "cuda", "rocm"),
    [("cpu", None, None, None), ("cu128", "cuda", "12.8", None), ("rocm6.4", "rocm", None, "6.4")],
)
def test_pytorch_index_labels(label, vendor, cuda, rocm):
    info = fields(f"torch-2.8.0+{label}-cp312-cp312-manylinux_2_28_x86_64.whl")
    assert info["local"] == label
    assert info["version"] == f"2.8.0+{label}"
    assert (info["vendor"], info["cuda"], info["rocm"], info["dtk"]) == (vendor, cuda, rocm, None)
    assert info["torch"] == "2.8.0"
    assert info["unknown_tokens"] == []


def test_cpu_label_is_recorded_for_the_checks():
    assert "cpu" in parse_wheel_filename(f"torch-2.13.0+cpu-{M228}.whl").builds
    assert "cpu" not in parse_wheel_filename(f"torch-2.13.0-{M228}.whl").builds


@pytest.mark.parametrize(
    ("token", "torch"),
    [
        ("torch290", "2.9.0"),
        ("torch280", "2.8.0"),
        ("torch2100", "2.10.0"),
        ("torch2110", "2.11.0"),
        ("torch2101", "2.10.1"),
        ("torch271", "2.7.1"),
        ("torch28", "2.8"),
        ("torch2.8", "2.8"),
        ("torch2.10", "2.10"),
    ],
)
def test_torch_token_decoding(token, torch):
    # Compact rule: one-digit major, last digit is the patch, the digits between the minor.
    info = parse_wheel_filename(f"vllm-0.11.0+das.opt1.dtk2604.{token}-{M228}.whl")
    assert info.torch == torch


@pytest.mark.parametrize(
    ("token", "dtk"),
    [
        ("dtk2604", "26.04"),
        ("dtk2404", "24.04"),
        ("dtk24043", "24.04.3"),
        ("dtk25.04.2", "25.04.2"),
    ],
)
def test_dtk_token_decoding(token, dtk):
    assert parse_wheel_filename(f"lmslim-0.2.1+das.{token}-{M228}.whl").names_version("dtk") == dtk


def test_unknown_label_tokens_are_kept_and_the_rest_still_parsed():
    info = parse_wheel_filename(f"vllm-0.11.0+das.opt1.hcu3.dtk2604.torch290.zz-{M228}.whl")
    assert info.unknown_tokens == ("hcu3", "zz")
    assert info.to_json()["unknown_tokens"] == ["hcu3", "zz"]
    assert (info.names_version("dtk"), info.torch, info.vendor) == ("26.04", "2.9.0", "das")


def test_a_number_that_is_no_date_is_unknown_not_a_build_date():
    info = parse_wheel_filename(f"torch-2.11.0+das.dtk2604.202513451530-{M228}.whl")
    assert info.unknown_tokens == ("202513451530",)


def test_wheel_without_local_label_has_no_label_facts():
    info = fields("numpy-1.26.4-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    assert info["local"] is None
    assert info["version"] == "1.26.4"
    assert [info[k] for k in ("vendor", "dtk", "torch", "cuda", "rocm", "cxx11abi")] == [None] * 6


def test_leading_directory_is_ignored():
    info = parse_wheel_filename(f"wheels/vendor/torch-2.9.0+das.opt1.dtk2604-{M228}.whl")
    assert (info.dist, info.filename) == ("torch", f"torch-2.9.0+das.opt1.dtk2604-{M228}.whl")


@pytest.mark.parametrize(
    "bad",
    [
        "torch-2.9.0-cp310-cp310-manylinux_2_28_x86_64.tar.gz",
        "torch-2.9.0-cp310-manylinux_2_28_x86_64.whl",
        "torch-two-cp310-cp310-manylinux_2_28_x86_64.whl",
        "torch-2.9.0+das..opt1-cp310-cp310-manylinux_2_28_x86_64.whl",
        "flash__attn-2.8.3-cp310-cp310-linux_x86_64.whl",
    ],
)
def test_invalid_wheel_filenames_raise_one_line_validation_error(bad):
    with pytest.raises(ValidationError) as caught:
        parse_wheel_filename(bad)
    assert bad in caught.value.message
    assert "\n" not in caught.value.message
    assert caught.value.return_code == ValidationError.return_code


@pytest.mark.parametrize(
    ("platform", "glibc"),
    [
        ("manylinux1_x86_64", "2.5"),
        ("manylinux2010_x86_64", "2.12"),
        ("manylinux2014_x86_64", "2.17"),
        ("manylinux_2_17_x86_64", "2.17"),
        ("manylinux_2_28_x86_64", "2.28"),
        ("manylinux_2_28_x86_64.manylinux2014_x86_64", "2.17"),
        ("linux_x86_64", None),
        ("any", None),
    ],
)
def test_glibc_floor(platform, glibc):
    assert glibc_floor(platform) == glibc


@pytest.mark.parametrize(
    ("tags", "cpython", "fits"),
    [
        ("cp310-cp310", "cp310", True),
        ("cp311-cp311", "cp310", False),
        ("cp310-cp310", "cp311", False),
        ("cp38-abi3", "cp310", True),
        ("cp38-abi3", "cp312", True),
        ("cp38-abi3", "cp37", False),
        ("py3-none", "cp311", True),
        ("py2.py3-none", "cp310", True),
        ("cp310-none", "cp310", True),
    ],
)
def test_python_tag_fits(tags, cpython, fits):
    info = parse_wheel_filename(f"pkg-1.0-{tags}-any.whl")
    assert python_tag_fits(info, cpython) is fits


def test_python_tag_fits_rejects_a_cell_tag_that_is_not_cpython():
    info = parse_wheel_filename("pkg-1.0-py3-none-any.whl")
    with pytest.raises(ValidationError, match="cp310"):
        python_tag_fits(info, "python3.10")


@pytest.mark.parametrize(
    ("platform", "glibc", "arch", "fits"),
    [
        ("manylinux_2_28_x86_64", "2.35", "x86_64", True),
        ("manylinux_2_35_x86_64", "2.35", "x86_64", True),
        ("manylinux_2_39_x86_64", "2.35", "x86_64", False),
        ("manylinux_2_28_aarch64", "2.35", "x86_64", False),
        ("manylinux2014_x86_64", "2.17", "x86_64", True),
        ("manylinux_2_34_x86_64.manylinux2014_x86_64", "2.28", "x86_64", True),
        ("linux_x86_64", "2.17", "x86_64", True),
        ("linux_x86_64", "2.35", "aarch64", False),
        ("musllinux_1_2_x86_64", "2.35", "x86_64", False),
        ("any", "2.5", "aarch64", True),
        ("manylinux_2_28_x86_64", "2.35", "amd64", True),
    ],
)
def test_platform_fits(platform, glibc, arch, fits):
    info = parse_wheel_filename(f"pkg-1.0-cp310-cp310-{platform}.whl")
    assert platform_fits(info, glibc=glibc, cpu_arch=arch) is fits


SOURCEFIND = "image.sourcefind.cn:5000/dcu/admin/base"


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        (
            f"{SOURCEFIND}/pytorch:2.4.1-ubuntu22.04-dtk25.04-py3.10",
            ("pytorch", "2.4.1", "ubuntu22.04", "25.04", "3.10", "", ""),
        ),
        (
            f"{SOURCEFIND}/vllm:0.9.2-ubuntu22.04-dtk25.04.2-py3.10",
            ("vllm", "0.9.2", "ubuntu22.04", "25.04.2", "3.10", "", ""),
        ),
        (
            f"{SOURCEFIND}/vllm:0.8.5-ubuntu22.04-dtk25.04.1-rc5-das1.6-py3.10-20250705",
            ("vllm", "0.8.5", "ubuntu22.04", "25.04.1", "3.10", "rc5-das1.6", "20250705"),
        ),
        (
            f"{SOURCEFIND}/jupyterlab-pytorch:2.1.0-ubuntu20.04-dtk24.04.1-py3.10-scnet",
            ("jupyterlab-pytorch", "2.1.0", "ubuntu20.04", "24.04.1", "3.10", "", "scnet"),
        ),
        (
            f"{SOURCEFIND}/pytorch:1.13.1-centos7.6-dtk23.10-py38",
            ("pytorch", "1.13.1", "centos7.6", "23.10", "3.8", "", ""),
        ),
    ],
)
def test_base_tag_reads_every_vendor_tag_form(ref, expected):
    base = base_tag(ref)
    assert isinstance(base, BaseTag)
    assert (base.platform, base.registry) == ("dtk", "image.sourcefind.cn:5000")
    assert (
        base.stack, base.stack_version, base.os, base.version, base.python, base.extra,
        base.suffix
    ) == expected


def test_base_tag_ignores_a_digest():
    ref = f"{SOURCEFIND}/pytorch:2.9.0-ubuntu22.04-dtk26.04-py3.10@sha256:" + "a" * 64
    base = base_tag(ref)
    assert base is not None
    assert (base.stack_version, base.version, base.python) == ("2.9.0", "26.04", "3.10")


@pytest.mark.parametrize(
    "ref",
    [
        "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04",
        "rocm/dev-ubuntu-24.04:6.4",
        f"{SOURCEFIND}/pytorch:latest",
        "registry.local/dcu/pytorch:2.9.0-ubuntu22.04-dtk26.04-py3.10",
    ],
)
def test_base_tag_returns_none_outside_the_pattern(ref):
    assert base_tag(ref) is None


def test_build_tag_does_not_shift_the_other_fields():
    info = parse_wheel_filename(f"torch-2.9.0+das.opt1.dtk2604-1-{M228}.whl")
    assert (info.dist, info.version, info.python_tag, info.platform_tag) == (
        "torch", "2.9.0+das.opt1.dtk2604", "cp310", "manylinux_2_28_x86_64",
    )
