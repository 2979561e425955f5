"""Vendor rehearsal cells (issue 21 item 3): derived from the real cells as data, locked, marked."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import subprocess

import pytest
from tests.conftest import CPU_CELL, K100_CELL, ROOT

from stackpin import rehearsal, rehearsal_base, vendortree
from stackpin.bootstrap import bootstrap_request
from stackpin.context import read_sources
from stackpin.errors import ConfigurationError
from stackpin.lock import read_lock, stale_reason
from stackpin.matrix import Variant, cell_to_dict
from stackpin.matrixfile import decode_matrix_lenient, parse_toml
from stackpin.render import RenderRequest, render
from stackpin.target import LABEL_REHEARSAL, Layout, load_cell

K100_REHEARSAL = "rehearsal-dtk2604-k100-torch290-py311"
# What derivation may change; everything else of the real cell must come through as it is.
CHANGED = {"id", "description", "python", "glibc", "base", "torch", "attention",
           "vendor_wheels", "rehearsal"}


@pytest.fixture(scope="module")
def derived(shipped_cells):
    return rehearsal.load_derived(ROOT, shipped_cells)


def test_every_dtk_and_rocm_cell_has_a_rehearsal_and_no_other(shipped_cells, derived):
    real = {c.id for c in shipped_cells.values() if c.platform in ("dtk", "rocm")}
    assert {c.rehearsal.of for c in derived.values()} == real
    assert all(rehearsal.is_rehearsal_id(cell_id) for cell_id in derived)


def test_a_rehearsal_is_its_real_cell_at_the_hosts_python_and_nothing_else(shipped_cells,
                                                                             derived):
    host = shipped_cells[CPU_CELL]
    for cell in derived.values():
        real = shipped_cells[cell.rehearsal.of]
        mine, theirs = cell_to_dict(cell), cell_to_dict(real)
        assert {k: v for k, v in mine.items() if k not in CHANGED} == \
               {k: v for k, v in theirs.items() if k not in CHANGED}, cell.id
        assert (cell.python, cell.glibc) == (host.python, host.glibc)
        assert cell.rehearsal.of_python == real.python
        assert cell.base.bootstrap.suite == host.base.bootstrap.suite
        assert set(cell.base.bootstrap.packages) == {*host.base.bootstrap.packages, "lld"}
        assert cell.variants == real.variants  # ROCm stable only, DTK 24.04 stable only


def test_vendor_wheels_keep_the_vendors_names_at_the_rehearsals_cpython(derived):
    cell = derived[K100_REHEARSAL]
    assert cell.torch.filename == \
        "torch-2.9.0+das.opt1.dtk2604-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert cell.attention.filename == \
        "flash_attn-2.8.3+das.opt1.dtk2604.torch290-cp311-cp311-manylinux_2_28_x86_64.whl"
    # The provided versions (the vendor's labels) are the real cell's.
    assert cell.provided["torch"].version == "2.9.0+das.opt1.dtk2604"


def test_the_stand_in_recipes(shipped_cells, derived):
    host = shipped_cells[CPU_CELL]
    real = shipped_cells["dtk2604-bw-torch2100-py310"]
    kinds = {w.filename.split("-")[0]: rehearsal.recipe(w, host)
             for w in (real.torch, real.attention, *real.vendor_wheels)}
    assert kinds["torch"].source == host.torch.filename  # the CPU cell's pinned torch
    assert kinds["torch"].source_sha256 == host.torch.sha256
    assert kinds["torch"].version_module == "torch/version.py"
    assert kinds["triton"].kind == "relabel" and kinds["triton"].source.startswith("triton-3.5.0-")
    assert kinds["flash_attn"].kind == "no-kernels"
    assert kinds["vllm"].kind == "metadata"
    assert "vllm: metadata only" in derived["rehearsal-dtk2604-bw-torch2100-py310".replace(
        "py310", "py311")].rehearsal.content


def test_every_stand_in_is_pinned_and_every_rehearsal_lock_is_current(derived):
    pins = rehearsal.read_pins(ROOT)
    for cell in derived.values():
        for wheel in (cell.torch, *cell.vendor_wheels,
                      *([cell.attention] if cell.attention else [])):
            assert pins.get(wheel.filename) == wheel.sha256 != "", wheel.filename
        lock = read_lock(ROOT, cell.id)
        assert lock is not None, f"no committed lock for {cell.id}"
        assert stale_reason(lock, cell) is None, cell.id
        assert lock.complete


# What a CPython change may add or drop (each behind a python_version marker upstream):
# backports of what 3.11 has itself (3.10 -> 3.11), and what 3.12 needs or lacks (ROCm's
# torch requires setuptools on 3.12; jaraco.context wants backports.tarfile below 3.12).
CPYTHON_MARKED = {"tomli", "async-timeout", "exceptiongroup", "backports-asyncio-runner",
                  "backports-tarfile", "setuptools"}


def test_a_rehearsal_installs_the_real_locks_versions_but_for_cpython_markers(derived):
    for cell in derived.values():
        real = read_lock(ROOT, cell.rehearsal.of)
        mine = read_lock(ROOT, cell.id)
        theirs = {w.name: w.version for w in real.wheels if w.source == "index"}
        ours = {w.name: w.version for w in mine.wheels if w.source == "index"}
        common = set(ours) & set(theirs)
        assert {n: ours[n] for n in common} == {n: theirs[n] for n in common}, cell.id
        assert set(ours) ^ set(theirs) <= CPYTHON_MARKED, f"{cell.id}: {set(ours) ^ set(theirs)}"


def test_a_real_cell_whose_lock_is_stale_has_no_rehearsal(shipped_cells, tmp_path):
    (tmp_path / "pinning" / "locks").mkdir(parents=True)
    source = ROOT / "pinning" / "locks" / f"{K100_CELL}.lock"
    data = json.loads(source.read_text())
    data["cell_digest"] = "0" * 64
    (tmp_path / "pinning" / "locks" / f"{K100_CELL}.lock").write_text(json.dumps(data))
    derived = rehearsal.load_derived(tmp_path, shipped_cells)
    assert all(c.rehearsal.of != K100_CELL for c in derived.values())


def test_a_matrix_file_may_not_declare_a_rehearsal(tmp_path):
    data = parse_toml(ROOT / "pinning" / "cpu.toml")
    data["cells"][CPU_CELL]["rehearsal"] = {"of": "x", "of_python": "cp310", "content": "y"}
    _matrix, problems = decode_matrix_lenient(data)
    assert any("rehearsal" in str(p) and "derived" in str(p) for p in problems)


def test_a_rehearsal_id_loads_through_the_same_target_as_any_cell(derived):
    assert load_cell(Layout(ROOT), K100_REHEARSAL) == derived[K100_REHEARSAL]
    with pytest.raises(ConfigurationError, match="rehearsal-dtk2604-k100-torch290-py311"):
        load_cell(Layout(ROOT), "rehearsal-dtk2604-k100-torch290-py312")


def test_stand_in_file_names():
    name = "pytorch_triton_rocm-3.4.0-cp312-cp312-linux_x86_64.whl"
    assert rehearsal.standin_filename(name, "cp311") == \
        "pytorch_triton_rocm-3.4.0-cp311-cp311-linux_x86_64.whl"
    assert rehearsal.standin_filename("x-1.0-py3-none-any.whl", "cp311") == \
        "x-1.0-cp311-none-any.whl"


# --- what the images built from them say ---------------------------------------------------


def _render(cell, variant=Variant.STABLE):
    return render(RenderRequest(cell=cell, variant=variant, lock=read_lock(ROOT, cell.id),
                                sources=read_sources(ROOT / "templates"),
                                stackpin_version="test"))


def test_rehearsal_images_are_labelled_and_say_so_in_image_json(derived, shipped_cells):
    cell = derived[K100_REHEARSAL]
    rendered = _render(cell, Variant.ENHANCED)
    label = rendered.labels[LABEL_REHEARSAL]
    assert label.startswith(f"vendor rehearsal of {K100_CELL}:")
    assert "not a dtk image" in label and "cp311 instead of cp310" in label
    info = json.loads(rendered.files["stackpin/image.json"])
    assert info["run_kind"] == "vendor rehearsal"
    assert info["rehearsal"]["of"] == K100_CELL
    assert rendered.base_reference == rehearsal_base.reference(cell)
    assert f"FROM {rehearsal_base.reference(cell)}" in rendered.dockerfile
    # A real cell's image says none of it.
    real = _render(shipped_cells[CPU_CELL])
    assert LABEL_REHEARSAL not in real.labels
    assert "run_kind" not in json.loads(real.files["stackpin/image.json"])


def test_the_guard_checks_the_env_script_was_sourced_where_the_cell_has_one(derived):
    dockerfile = _render(derived[K100_REHEARSAL]).dockerfile
    assert "--env-script /opt/dtk/env.sh" in dockerfile
    assert "COPY verify/stackpin_verify/dtk_env.py /opt/stackpin/dtk_env.py" in dockerfile
    rocm = _render(derived["rehearsal-rocm64-gfx942-torch280-py311"]).dockerfile
    assert "--env-script" not in rocm


# --- the stand-in vendor tree and the base ------------------------------------------------


def test_the_tree_holds_what_l0_dtk_env_looks_for(derived, tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "verify"))
    from stackpin_verify import dtk_env

    cell = derived[K100_REHEARSAL]
    entries = {e.path: e for e in vendortree.entries(cell)}
    root = vendortree.tree_root(cell)
    for what, patterns in dtk_env.REQUIRED:  # globs relative to the tree's root
        assert any(fnmatch.fnmatch(path, f"{root}/{p}") for p in patterns for path in entries), what
    lld = entries[f"{root}/llvm/bin/ld.lld"]
    assert (lld.kind, lld.target) == ("link", vendortree.DEBIAN_LLD)  # Debian's real linker
    assert cell.env["TRITON_HIP_LLD_PATH"] == "/opt/dtk/llvm/bin/ld.lld"
    assert entries["/opt/dtk"].target == "dtk-26.04-rehearsal"
    assert dtk_env.versions_in_paths({"ROCM_PATH": root}) == {"ROCM_PATH": "26.04"}
    # Every file says it is a stand-in; every tool refuses.
    for entry in entries.values():
        if entry.kind == "file" and not entry.path.endswith("env.sh"):
            assert "stackpin vendor rehearsal stand-in" in entry.text, entry.path
    assert "/opt/hyhal/bin/hy-smi" in entries
    rocm = {e.path for e in vendortree.entries(derived["rehearsal-rocm64-gfx942-torch280-py311"])}
    assert "/opt/rocm-6.4-rehearsal/bin/rocm-smi" in rocm  # /opt/rocm/bin/rocm-smi


def test_the_stand_in_env_script_sets_what_l0_reads_in_a_clean_shell(derived, tmp_path):
    cell = derived[K100_REHEARSAL]
    script = tmp_path / "env.sh"
    script.write_text(vendortree.env_script(cell))
    done = subprocess.run(["env", "-i", "sh", "-c", f'. "{script}" && env'],
                          capture_output=True, text=True, check=True)
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert env["ROCM_PATH"] == env["HIP_PATH"] == "/opt/dtk"
    assert env["PATH"].startswith("/opt/dtk/bin:/opt/dtk/llvm/bin:")
    assert env["STACKPIN_REHEARSAL_TREE"] == "/opt/dtk-26.04-rehearsal"


def test_the_tree_layer_and_base_are_the_same_bytes_each_time(derived):
    cell = derived[K100_REHEARSAL]
    assert vendortree.tree_tar(cell, mtime=1) == vendortree.tree_tar(cell, mtime=1)
    assert rehearsal_base.reference(cell).startswith("stackpin/rehearsal-base-dtk:")
    # K100 and BW rehearse one DTK release from one rootfs: one base.
    bw = derived["rehearsal-dtk2604-bw-torch2100-py311"]
    assert rehearsal_base.reference(bw) == rehearsal_base.reference(cell)
    rocm = derived["rehearsal-rocm64-gfx942-torch280-py311"]
    assert bootstrap_request(rocm) == bootstrap_request(cell)  # the rootfs is shared
    assert rehearsal_base.reference(rocm) != rehearsal_base.reference(cell)


def test_the_base_puts_the_vendors_tools_on_path_and_says_what_it_is(derived):
    cell = derived[K100_REHEARSAL]
    config = json.loads(rehearsal_base.image_config(cell, diff_ids=("sha256:a", "sha256:b")))
    env = dict(item.split("=", 1) for item in config["config"]["Env"])
    assert env["PATH"].split(":")[:2] == ["/opt/dtk/bin", "/opt/hyhal/bin"]
    assert "not the vendor's base image" in config["config"]["Labels"][LABEL_REHEARSAL]


def test_a_cpu_cell_has_no_tree():
    from tests.conftest import ROOT as root

    cells = {c.id: c for c in [load_cell(Layout(root), CPU_CELL)]}
    with pytest.raises(ValueError, match="only dtk, rocm"):
        vendortree.facts(cells[CPU_CELL])
    with pytest.raises(ConfigurationError, match="only dtk, rocm cells rehearse"):
        rehearsal.derive(cells[CPU_CELL], host=cells[CPU_CELL], pins={}, locked={})


def test_derivation_is_pure(shipped_cells):
    host = shipped_cells[CPU_CELL]
    real = shipped_cells[K100_CELL]
    one = rehearsal.derive(real, host=host, pins={}, locked={"six": "1.17.0"})
    two = rehearsal.derive(dataclasses.replace(real), host=host, pins={}, locked={"six": "1.17.0"})
    assert one == two
    assert one.rehearsal.constraints == {"six": "1.17.0"}


def test_one_stand_in_file_name_is_one_content_across_cells(shipped_cells, derived):
    # wheels/vendor/ holds one file per name: two cells pinning one vendor file (K100 and
    # BW pin one triton) must make it from the same inputs, or one would overwrite the other.
    from stackpin.boundary import effective_provided
    from stackpin.rehearsal_make import vendor_pairs

    host = shipped_cells[CPU_CELL]
    seen: dict[str, tuple[object, ...]] = {}
    for cell in derived.values():
        real = shipped_cells[cell.rehearsal.of]
        provided = effective_provided(real)
        for old, new in vendor_pairs(real, cell):
            recipe = rehearsal.recipe(old, host)
            name = old.filename.split("-")[0].replace("_", "-")
            inputs = (old.filename, recipe, provided[name].requires if name in provided else ())
            assert seen.setdefault(new.filename, inputs) == inputs, new.filename
    assert "triton-3.5.0+das.opt1.dtk2604-cp311-cp311-manylinux_2_28_x86_64.whl" in seen


def test_no_tree_member_goes_through_the_link_or_is_both_a_folder_and_a_link(derived):
    # A layer member under a symlink it also holds would be written through the link (or
    # refused) when Docker applies the layer.
    for cell in derived.values():
        entries = vendortree.entries(cell)
        links = {e.path for e in entries if e.kind == "link"}
        paths = [e.path for e in entries]
        assert len(paths) == len(set(paths)), cell.id
        assert not [p for p in paths for link in links if p.startswith(link + "/")], cell.id
