"""Vendor rehearsal stand-ins (issue 21, item 3): marked, refused by export, relabelled wheels."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest
from test_bundle_fakes import CPU_CELL, engine_with_cpu, export_cpu

from stackpin.bundle.resolved import refuse_rehearsal
from stackpin.cli.bundle_cmd import export
from stackpin.errors import BundleError, ValidationError
from stackpin.standin import MARKER, StandIn, relabel_wheel
from stackpin.target import LABEL_REHEARSAL

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


def test_a_stand_in_takes_the_placeholders_requirements_and_reports_the_vendors_version(
        tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    path = source / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    info = "torch-2.13.0+cpu.dist-info/"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr("torch/version.py", "__version__ = '2.13.0+cpu'\nhip = None\n")
        wheel.writestr("torch/_C.so", b"\x7fELF" + bytes(4096))
        wheel.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n"
                       "Requires-Dist: setuptools\nRequires-Dist: filelock\n\nLong text.\n")
        wheel.writestr(info + "WHEEL", "Wheel-Version: 1.0\nTag: cp311-cp311-manylinux_2_28_x86_64\n")
        wheel.writestr(info + "RECORD", "")
    stand_in = StandIn(filename=VENDOR_TORCH, stands_for=STANDS_FOR,
                       requires=("filelock", "sympy>=1.13.3"), version_module="torch/version.py")
    made = relabel_wheel(path, stand_in, tmp_path)
    with zipfile.ZipFile(made) as wheel:
        assert wheel.testzip() is None
        metadata = wheel.read("torch-2.9.0+das.opt1.dtk2604.dist-info/METADATA").decode()
        assert "Requires-Dist: setuptools" not in metadata  # what the lock was resolved with
        assert metadata.count("Requires-Dist:") == 2 and "Requires-Dist: sympy>=1.13.3" in metadata
        assert metadata.endswith("\n\nLong text.\n")
        version = wheel.read("torch/version.py").decode()
        assert "__version__ = '2.9.0+das.opt1.dtk2604'" in version and "hip = None" in version
        assert STANDS_FOR in version
        # Copied as compressed in the source: same bytes, same compression.
        with zipfile.ZipFile(path) as src:
            assert wheel.read("torch/_C.so") == src.read("torch/_C.so")
            assert wheel.getinfo("torch/_C.so").compress_type == zipfile.ZIP_DEFLATED
            assert wheel.getinfo("torch/_C.so").CRC == src.getinfo("torch/_C.so").CRC


def test_a_version_module_without_a_version_line_is_refused(tmp_path):
    source = cpu_wheel(tmp_path)
    with zipfile.ZipFile(source, "a") as wheel:
        wheel.writestr("torch/extra.py", "x = 1\n")
    stand_in = StandIn(filename=VENDOR_TORCH, stands_for=STANDS_FOR, version_module="torch/extra.py")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValidationError, match="no __version__ line"):
        relabel_wheel(source, stand_in, out)
    assert list(out.iterdir()) == []  # nothing half-written is left


def test_a_metadata_only_stand_in_installs_nothing_but_says_what_it_is(tmp_path):
    from stackpin.standin import made_wheel

    name = "vllm-0.18.1+das.opt1.dtk2604.torch2100-cp311-cp311-manylinux_2_28_x86_64.whl"
    made = made_wheel(StandIn(filename=name, stands_for=STANDS_FOR, requires=("torch==2.10.0",)),
                      tmp_path)
    with zipfile.ZipFile(made) as wheel:
        info = "vllm-0.18.1+das.opt1.dtk2604.torch2100.dist-info/"
        assert sorted(wheel.namelist()) == sorted(
            [info + "METADATA", info + "WHEEL", info + MARKER, info + "RECORD"])
        metadata = wheel.read(info + "METADATA").decode()
        assert "Version: 0.18.1+das.opt1.dtk2604.torch2100" in metadata
        assert "Requires-Dist: torch==2.10.0" in metadata
        assert "Tag: cp311-cp311-manylinux_2_28_x86_64" in wheel.read(info + "WHEEL").decode()


def test_a_package_without_kernels_imports_and_refuses_every_kernel_by_name(tmp_path):
    import subprocess
    import sys

    from stackpin.standin import no_kernel_module

    for path, text in no_kernel_module("flash_attn", version="2.8.3", stands_for=STANDS_FOR).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    # As verify's flashpkg asks for it: the attribute, whose error L3 then quotes.
    probe = "import flash_attn; print(flash_attn.__version__); flash_attn.flash_attn_func"
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, check=False)
    assert done.stdout.strip() == "2.8.3"
    assert done.returncode == 1
    assert "flash_attn.flash_attn_func: " + STANDS_FOR + ": it has no kernels" in done.stderr
