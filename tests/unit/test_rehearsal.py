"""Vendor rehearsal stand-ins (issue 21, item 3): marked, refused by export, relabelled wheels."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest
from test_bundle_fakes import CPU_CELL, engine_with_cpu, export_cpu

from stackpin.cli.bundle_cmd import export
from stackpin.errors import BundleError, ValidationError
from stackpin.rehearsal import LABEL_REHEARSAL, MARKER, StandIn, refuse_rehearsal, relabel_wheel

STANDS_FOR = "rehearsal: torch 2.13.0+cpu content under the vendor label; not a DCU build"
VENDOR_TORCH = "torch-2.9.0+das.opt1.dtk2604-cp311-cp311-manylinux_2_28_x86_64.whl"


def test_export_refuses_a_rehearsal_image_and_names_the_way_out(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells, labels={LABEL_REHEARSAL: STANDS_FOR})
    with pytest.raises(BundleError) as caught:
        export_cpu(tmp_path, shipped_cells, engine=engine)
    assert f"--allow-rehearsal {CPU_CELL}" in caught.value.message
    assert not (tmp_path / "out" / "bundle").exists()


def test_export_takes_a_rehearsal_image_when_its_cell_is_named(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells, labels={LABEL_REHEARSAL: STANDS_FOR})
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine,
                           allow_rehearsal=frozenset({CPU_CELL}))
    (image,) = result.images
    assert image.labels[LABEL_REHEARSAL] == STANDS_FOR  # the manifest still says what it is


def test_naming_another_cell_does_not_let_a_rehearsal_through():
    with pytest.raises(BundleError):
        refuse_rehearsal({LABEL_REHEARSAL: STANDS_FOR}, cell="dtk-a", tag="t",
                         allowed={"dtk-b"})
    refuse_rehearsal({}, cell="dtk-a", tag="t", allowed=())  # a real image passes


def test_the_cli_declares_allow_rehearsal_on_export():
    option = next(p for p in export.params if p.name == "allow_rehearsal")
    assert option.multiple and "--allow-rehearsal" in option.opts


def cpu_wheel(folder: Path) -> Path:
    """A small wheel shaped as PyPI's CPU torch is (dist-info, RECORD, a module)."""
    path = folder / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    info = "torch-2.13.0+cpu.dist-info/"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("torch/__init__.py", "__version__ = '2.13.0+cpu'\n")
        wheel.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: torch\n"
                       "Version: 2.13.0+cpu\nRequires-Dist: filelock\n")
        wheel.writestr(info + "WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                       "Tag: cp311-cp311-manylinux_2_28_x86_64\n")
        wheel.writestr(info + "RECORD", "stale\n")
    return path


def test_a_relabelled_wheel_carries_the_vendor_name_version_tag_and_marker(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    made = relabel_wheel(cpu_wheel(tmp_path), StandIn(filename=VENDOR_TORCH,
                                                       stands_for=STANDS_FOR), out)
    assert made.name == VENDOR_TORCH
    with zipfile.ZipFile(made) as wheel:
        names = set(wheel.namelist())
        info = "torch-2.9.0+das.opt1.dtk2604.dist-info/"
        assert not any(n.startswith("torch-2.13.0") for n in names)
        metadata = wheel.read(info + "METADATA").decode()
        assert "Version: 2.9.0+das.opt1.dtk2604\n" in metadata
        assert "Requires-Dist: filelock" in metadata  # the rest of the metadata is kept
        assert wheel.read(info + "WHEEL").decode().count("Tag:") == 1
        assert wheel.read(info + MARKER).decode().strip() == STANDS_FOR
        assert wheel.read("torch/__init__.py") == b"__version__ = '2.13.0+cpu'\n"
        for line in wheel.read(info + "RECORD").decode().splitlines():
            name, digest, size = line.split(",")
            if name == info + "RECORD":
                continue
            data = wheel.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert (digest, int(size)) == (f"sha256={expected.decode()}", len(data))
        assert {line.split(",")[0] for line in
                wheel.read(info + "RECORD").decode().splitlines()} == names


def test_relabelling_is_byte_for_byte_repeatable(tmp_path):
    source = cpu_wheel(tmp_path)
    stand_in = StandIn(filename=VENDOR_TORCH, stands_for=STANDS_FOR)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert relabel_wheel(source, stand_in, first).read_bytes() == relabel_wheel(
        source, stand_in, second).read_bytes()


def test_a_wheel_of_another_distribution_cannot_stand_in(tmp_path):
    stand_in = StandIn(filename="flash_attn-2.8.3+das.opt1.dtk2604.torch290-cp311-cp311-"
                       "manylinux_2_28_x86_64.whl", stands_for=STANDS_FOR)
    with pytest.raises(ValidationError, match="another distribution"):
        relabel_wheel(cpu_wheel(tmp_path), stand_in, tmp_path)
