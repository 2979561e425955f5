"""Hostile matrices: values that would reach image names, file names, mounts or the shell
are refused with one line each, never repaired; unreadable files are one line too."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner
from test_matrix import MINIMAL, problems_of

from stackpin.checks import check_cell
from stackpin.cli.main import cli
from stackpin.errors import BundleError, ConfigurationError
from stackpin.matrix_safety import SENSITIVE_HOST_PATHS, sensitive_host_path
from stackpin.matrixfile import decode_matrix, load_cells, parse_toml

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def _with(extra: str, *, torch: str = TORCH) -> str:
    return MINIMAL.replace(TORCH, torch) + extra


@pytest.mark.parametrize("cell_id", [
    "a" * 65, "C1", "a..b", "-a", "a-", "a_b", "a/b", "a b", "a\nb", ".a", "a:b", "é",
])
def test_cell_ids_that_do_not_fit_docker_references_or_file_names(cell_id):
    text = MINIMAL.replace("cells.c1", f"cells.{json.dumps(cell_id)}")
    found = problems_of(text)
    assert any("a cell id is 1-64 lower-case letters" in p for p in found), found
    assert all("\n" not in p for p in found)


@pytest.mark.parametrize("cell_id", ["a" * 64, "c1", "a.b", "a--b", "cpu-bookworm-torch2130-py311"])
def test_cell_ids_that_fit(cell_id):
    assert problems_of(MINIMAL.replace("cells.c1", f"cells.{json.dumps(cell_id)}")) == []


@pytest.mark.parametrize("filename", [
    f"wheels/{TORCH}", f"/tmp/{TORCH}", f"https://example.org/{TORCH}", f"..\\\\{TORCH}",
    f"../{TORCH}", f"{TORCH}\\n", f"x {TORCH}",
])
def test_wheel_filenames_with_paths_or_urls_are_refused_not_truncated(filename):
    found = problems_of(MINIMAL.replace(f'filename = "{TORCH}"', f'filename = "{filename}"'))
    assert any(p.startswith("cells.c1.torch.filename: a bare wheel file name") for p in found), \
        found


@pytest.mark.parametrize(("volume", "ok"), [
    ("/opt/hyhal:/opt/hyhal:ro", True),
    ("/data/models:/models", True),
    ("/:/host", False), ("/etc:/etc:ro", False), ("/etc/ssl:/ssl", False),
    ("/var/run/docker.sock:/var/run/docker.sock", False), ("/root/.ssh:/k", False),
    ("/opt/../etc:/x", False), ("//etc:/x", False), ("/etc/:/x", False), ("rel:/x", False),
    ("named:/x", False), ("/data:/", False), ("/data:/x/../y", False), ("/data", False),
    ("/data:/x:z", False), ("/home/user:/h", False), ("/proc:/p", False),
])
def test_volumes_that_reach_into_the_host_are_refused(volume, ok):
    found = problems_of(_with(f'[cells.c1.run]\nvolumes = ["{volume}"]\n'))
    assert (found == []) == ok, found


@pytest.mark.parametrize(("script", "ok"), [
    ("/opt/dtk/env.sh", True), ("../env.sh", False), ("/opt/../etc/profile", False),
    ("env.sh", False), ("/opt/dtk/env.sh; rm -rf /", False), ("/opt/$(id)/env.sh", False),
])
def test_env_script_is_a_plain_absolute_path_in_the_image(script, ok):
    found = problems_of(MINIMAL.replace('numpy = "<2"', f'numpy = "<2"\nenv_script = "{script}"'))
    assert (found == []) == ok, found


@pytest.mark.parametrize(("mirror", "ok"), [
    ("http://deb.debian.org/debian", True), ("https://mirror.example:8443/debian", True),
    ("file:///srv/mirror/debian", True), ("file:///", False), ("file:///etc", False),
    ("file:///srv/../etc", False), ("ftp://x/debian", False), ("http://x/debian ; rm", False),
    ("/srv/mirror", False),
])
def test_bootstrap_mirror_urls(mirror, ok):
    found = problems_of(MINIMAL.replace("http://deb.debian.org/debian", mirror))
    assert (found == []) == ok, found


def test_the_sensitive_list_is_the_same_in_python_and_in_the_site_scripts():
    lib = (ROOT / "bundle" / "bin" / "lib.sh").read_text()
    listed = re.search(r"SENSITIVE_HOST_PATHS=\(([^)]*)\)", lib)
    assert listed is not None
    assert tuple(listed.group(1).split()) == SENSITIVE_HOST_PATHS
    assert sensitive_host_path("/") and not sensitive_host_path("/opt/hyhal")


def test_cxx11abi_false_wheel_in_a_true_torch_cell_is_a_violation():
    torch = "torch-2.5.1+cpu.cxx11.abi-cp311-cp311-linux_x86_64.whl"
    for label, bad in (("cxx11abiFALSE", True), ("cxx11abiTRUE", False)):
        wheel = f"ext-1.0+{label}-cp311-cp311-linux_x86_64.whl"
        text = _with(f'[[cells.c1.vendor_wheels]]\nfilename = "{wheel}"\n', torch=torch)
        cell = decode_matrix(tomllib.loads(text), source="t.toml").cells["c1"]
        abi = [v for v in check_cell(cell) if "cxx11abi" in v.expected]
        assert bool(abi) == bad, abi
        if bad:
            assert abi[0].field == "vendor_wheels[0].filename"
            assert "cxx11abi FALSE" in abi[0].found


def test_duplicate_ids_across_files_fail_matrix_check(tmp_path):
    for name in ("a.toml", "b.toml"):
        (tmp_path / name).write_text(MINIMAL)
    done = CliRunner().invoke(cli, ["matrix", "check", str(tmp_path / "a.toml"),
                                    str(tmp_path / "b.toml")])
    assert done.exit_code == 3
    assert "cells.c1: the id is also declared in" in done.output


@pytest.mark.parametrize("kind", ["directory", "device", "fifo", "non-utf8", "deep", "huge",
                                  "missing"])
def test_unreadable_matrix_files_are_one_line(tmp_path, kind):
    path = tmp_path / "m.toml"
    if kind == "directory":
        path.mkdir()
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "non-utf8":
        path.write_bytes(MINIMAL.encode() + b'\ndescription = "\xff\xfe"\n')
    elif kind == "deep":
        path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    elif kind == "huge":
        with path.open("wb") as handle:
            handle.truncate(64 << 20)
    with pytest.raises(ConfigurationError) as caught:
        parse_toml(path)
    assert "\n" not in caught.value.message
    done = CliRunner().invoke(cli, ["matrix", "check", str(path)])
    # Naming what is not a file is a usage error; a file that is no matrix, configuration.
    wrong_kind = kind in ("directory", "device", "fifo", "missing")
    assert done.exit_code == (2 if wrong_kind else 3), done.output
    assert len(done.output.strip().splitlines()) == 1, done.output
    with pytest.raises(ConfigurationError):
        load_cells([path])


@pytest.mark.parametrize(("setting", "ok"), [
    ('shm_size = "32g"', True), ('shm_size = "32g --privileged"', False),
    ('gpus = "all"', True), ('gpus = "all --privileged"', False),
    ('ipc = "host"', True), ('ipc = "container:x"', False),
    ('group_add = ["video"]', True), ('group_add = ["video;id"]', False),
    ('cap_add = ["SYS_PTRACE"]', True), ('security_opt = ["seccomp=unconfined"]', True),
    ('security_opt = ["x y"]', False), ('devices = ["/dev/kfd"]', True),
    ('devices = ["/dev/../etc/shadow"]', False),
])
def test_run_flags_are_plain_values(setting, ok):
    found = problems_of(_with(f"[cells.c1.run]\n{setting}\n"))
    assert (found == []) == ok, found


def test_an_opt_in_variable_opts_in_only_with_1(tmp_path, monkeypatch):
    from stackpin.bundle import trust

    for value, insecure in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv(trust.INSECURE_ENV, value)
        if insecure:
            assert trust.resolve(None).insecure
        else:
            with pytest.raises(BundleError, match="no trusted key"):
                trust.resolve(None)
    for value in ("false", "no", "yes", "true "):
        monkeypatch.setenv(trust.INSECURE_ENV, value)
        with pytest.raises(BundleError, match="set it to 1"):
            trust.resolve(None)
