"""L0.dtk_env from the real environment (issue 22): the cell's script sourced in a clean
shell, compared with the process's variables; the DTK version in the paths; the files the
stack loads from the tree. Synthetic DTK trees in tmp dirs stand in for /opt/dtk (the
real tree is the vendor's); the shell, the sourcing and the file checks are real."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import verify_helpers

from stackpin_verify import dtk_env, level0
from stackpin_verify.checks import CheckResult, run_check

TREE_FILES = (
    "lib/libamdhip64.so.6",
    "bin/hipcc",
    "llvm/bin/ld.lld",
    "amdgcn/bitcode/ocml.bc",
)


def make_tree(root: Path, files: tuple[str, ...] = TREE_FILES) -> Path:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return root


def write_script(path: Path, root: Path) -> Path:
    path.write_text(
        f"export ROCM_PATH={root}\n"
        f"export HIP_PATH={root}\n"
        f"export PATH={root}/bin:{root}/llvm/bin:$PATH\n"
        f"export LD_LIBRARY_PATH={root}/lib\n"
        f"export TRITON_HIP_LLD_PATH={root}/llvm/bin/ld.lld\n"
    )
    return path


def sourced_environ(script: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """What a process that sourced ``script`` holds (plus the entrypoint's own variables)."""
    environ = dict(base or {"HOME": "/root", "PATH": "/usr/local/bin:/usr/bin:/bin"})
    exported = dtk_env.exported_by(dtk_env.source_script(str(script)), dtk_env.clean_shell())
    for name, value in exported.items():
        # The entrypoint sources the script over the image's own PATH.
        environ[name] = value if name != "PATH" else f"/opt/conda/bin:{value}:{environ['PATH']}"
    return environ


def _check(monkeypatch, script: Path, environ: dict[str, str], **image) -> CheckResult:
    monkeypatch.setattr(level0.os, "environ", environ)
    info = verify_helpers.image_info(
        platform="dtk", env_script=str(script), platform_version="26.04", **image
    )
    ctx = verify_helpers.cpu_context(info)
    return run_check("L0.dtk_env", functools.partial(level0.check_dtk_env, ctx))


@pytest.fixture
def dtk(tmp_path: Path) -> tuple[Path, Path]:
    """A DTK 26.04 tree with everything the stack loads and its env script."""
    root = make_tree(tmp_path / "dtk-26.04-DCC2602")
    return root, write_script(tmp_path / "env.sh", root)


def test_sourced_script_and_complete_tree_pass(monkeypatch, dtk):
    root, script = dtk
    result = _check(monkeypatch, script, sourced_environ(script))
    assert result.status == "pass", result.reason
    assert result.metrics["root"] == str(root)
    assert result.metrics["dtk_version_paths"] == {"ROCM_PATH": "26.04", "HIP_PATH": "26.04"}
    assert result.metrics["missing"] == []
    assert "ROCM_PATH" in result.metrics["exported"]
    assert "SHLVL" not in result.metrics["exported"]


def test_script_never_sourced_fails_saying_so(monkeypatch, dtk):
    _, script = dtk
    result = _check(monkeypatch, script, {"PATH": "/usr/bin:/bin"})
    assert result.status == "fail"
    assert result.reason.startswith(f"DTK env script {script} was never sourced: none of ")
    assert "HIP_PATH, ROCM_PATH, TRITON_HIP_LLD_PATH is set in this process" in result.reason


def test_stale_environment_fails_naming_each_variable(monkeypatch, dtk, tmp_path):
    root, script = dtk
    old = make_tree(tmp_path / "dtk-24.04")
    environ = sourced_environ(write_script(tmp_path / "old.sh", old))
    result = _check(monkeypatch, script, environ)
    assert result.status == "fail"
    assert result.reason.startswith(f"DTK environment is stale (not what {script} sets now): ")
    assert f"ROCM_PATH='{old}', the script sets '{root}'" in result.reason
    assert f"LD_LIBRARY_PATH lacks {root}/lib" in result.reason
    assert f"PATH lacks {root}/bin:{root}/llvm/bin" in result.reason


def test_base_images_inherited_variables_are_stale_even_pointing_at_a_real_tree(
    monkeypatch, dtk, tmp_path
):
    # ROCM_PATH from the base image names an existing tree (the old check's pass), but the
    # script was never sourced on top: HIP_PATH and the library path are missing.
    root, script = dtk
    environ = {"PATH": "/usr/bin", "ROCM_PATH": str(root)}
    result = _check(monkeypatch, script, environ)
    assert result.status == "fail"
    assert "DTK environment is stale" in result.reason
    assert "HIP_PATH=None, the script sets" in result.reason


def test_empty_tree_fails_as_a_leftover_directory(monkeypatch, tmp_path):
    root = tmp_path / "dtk-26.04"
    root.mkdir()
    script = write_script(tmp_path / "env.sh", root)
    result = _check(monkeypatch, script, sourced_environ(script))
    assert result.status == "fail"
    assert result.reason == (
        f"DTK tree {root} is empty or not a directory (a leftover, not an install)"
    )


@pytest.mark.parametrize("gone", TREE_FILES)
def test_each_missing_file_is_named(monkeypatch, tmp_path, gone):
    root = make_tree(tmp_path / "dtk-26.04", tuple(f for f in TREE_FILES if f != gone))
    script = write_script(tmp_path / "env.sh", root)
    result = _check(monkeypatch, script, sourced_environ(script))
    assert result.status == "fail"
    assert result.reason.startswith(f"DTK tree {root} lacks: ")
    assert len(result.metrics["missing"]) == 1
    what = result.metrics["missing"][0]
    if gone == "llvm/bin/ld.lld":
        assert what == f"ld.lld (TRITON_HIP_LLD_PATH={root}/llvm/bin/ld.lld is no file named ld.lld)"
    else:
        assert what.split(" (")[0] in {"HIP runtime library", "hipcc", "device libraries"}


def test_ld_lld_is_looked_for_in_the_tree_without_the_triton_variable(tmp_path):
    root = make_tree(tmp_path / "t", tuple(f for f in TREE_FILES if f != "llvm/bin/ld.lld"))
    report = dtk_env.inspect_tree(str(root), None)
    assert report.missing == ("ld.lld (llvm/bin/ld.lld or lib/llvm/bin/ld.lld)",)
    assert dtk_env.inspect_tree(str(root), str(tmp_path / "lld")).missing[0].startswith(
        "ld.lld (TRITON_HIP_LLD_PATH="
    )


def test_dtk_release_of_the_paths_must_be_the_cells(monkeypatch, tmp_path):
    root = make_tree(tmp_path / "dtk-24.04.3")
    script = write_script(tmp_path / "env.sh", root)
    result = _check(monkeypatch, script, sourced_environ(script))
    assert result.status == "fail"
    assert result.reason == (
        "HIP_PATH names DTK 24.04.3; ROCM_PATH names DTK 24.04.3, the cell's DTK is 26.04: "
        "the tree is another release's"
    )


def test_version_is_read_through_the_opt_dtk_symlink(tmp_path):
    real = make_tree(tmp_path / "dtk-26.04-DCC2602-0317")
    link = tmp_path / "dtk"
    link.symlink_to(real)
    assert dtk_env.versions_in_paths({"ROCM_PATH": str(link)}) == {"ROCM_PATH": "26.04"}
    assert dtk_env.judge_version({"ROCM_PATH": "26.04.1"}, "26.04") is None
    assert dtk_env.judge_version({"ROCM_PATH": "26.1"}, "26.04") is not None


@pytest.mark.parametrize(
    ("platform_version", "torch", "want"),
    [
        ("26.04", "2.9.0+das.opt1.dtk2604", "26.04"),
        ("", "2.9.0+das.opt1.dtk2604", "26.04"),
        ("", "2.4.1+das.opt1.dtk24043", "24.04.3"),
        ("", "2.9.0+cpu", None),
    ],
)
def test_cells_release_from_image_json_or_the_torch_label(platform_version, torch, want):
    assert dtk_env.cell_dtk_version(platform_version, torch) == want


def test_missing_script_keeps_its_reason(monkeypatch, tmp_path):
    result = _check(monkeypatch, tmp_path / "env.sh", {})
    assert (result.status, result.reason) == (
        "fail",
        f"DTK env script {tmp_path / 'env.sh'} does not exist",
    )


def test_script_that_fails_to_source_quotes_the_shell(monkeypatch, tmp_path):
    script = tmp_path / "env.sh"
    script.write_text("echo broken >&2\nexit 3\n")
    result = _check(monkeypatch, script, {})
    assert result.status == "fail"
    assert result.reason == f"sourcing {script} in a clean shell exited 3: broken"


def test_script_exporting_nothing_cannot_set_up_dtk(monkeypatch, tmp_path):
    script = tmp_path / "env.sh"
    script.write_text("true\n")
    result = _check(monkeypatch, script, {})
    assert result.status == "fail"
    assert result.reason.startswith(f"{script} exports no variable in a clean shell")
    assert "the script sets none of ROCM_PATH, DTK_PATH, HIP_PATH" in result.reason


def test_the_clean_shell_sees_none_of_this_process(monkeypatch, tmp_path):
    monkeypatch.setenv("ROCM_PATH", "/leaked")
    script = tmp_path / "env.sh"
    script.write_text('export SEEN="${ROCM_PATH:-unset}"\n')
    assert dtk_env.source_script(str(script))["SEEN"] == "unset"


def test_env0_parsing_keeps_newlines_and_drops_the_shells_own():
    raw = b"A=1\0B=two\nlines\0SHLVL=1\0_=/usr/bin/env\0PWD=/\0"
    assert dtk_env.parse_env0(raw) == {"A": "1", "B": "two\nlines"}


# --- what mutation testing found unpinned (docs/verification.md) ---------------------------


def test_passing_metrics_in_full(monkeypatch, dtk):
    root, script = dtk
    result = _check(monkeypatch, script, sourced_environ(script))
    assert result.metrics == {
        "env_script": str(script),
        "exported": ["HIP_PATH", "LD_LIBRARY_PATH", "PATH", "ROCM_PATH", "TRITON_HIP_LLD_PATH"],
        "root": str(root),
        "dtk_version_cell": "26.04",
        "dtk_version_paths": {"ROCM_PATH": "26.04", "HIP_PATH": "26.04"},
        "missing": [],
    }


def test_the_processs_triton_linker_counts_when_the_script_sets_none(monkeypatch, tmp_path):
    """The entrypoint may set TRITON_HIP_LLD_PATH itself: then ld.lld is where it points,
    not necessarily in the tree."""
    root = make_tree(tmp_path / "dtk-26.04", tuple(f for f in TREE_FILES if "ld.lld" not in f))
    lld = make_tree(tmp_path / "elsewhere", ("ld.lld",)) / "ld.lld"
    script = tmp_path / "env.sh"
    script.write_text(f"export ROCM_PATH={root}\n")
    environ = {"ROCM_PATH": str(root), "TRITON_HIP_LLD_PATH": str(lld)}
    result = _check(monkeypatch, script, environ)
    assert result.status == "pass", result.reason
    assert result.metrics["missing"] == []


def test_the_scripts_triton_linker_wins_over_the_tree(monkeypatch, tmp_path):
    # The script names a linker that is not there; another ld.lld in the tree must not
    # stand in for it (triton links with the one the variable names).
    files = (*(f for f in TREE_FILES if "ld.lld" not in f), "lib/llvm/bin/ld.lld")
    root = make_tree(tmp_path / "dtk-26.04", files)
    script = write_script(tmp_path / "env.sh", root)
    environ = {k: v for k, v in sourced_environ(script).items() if k != "TRITON_HIP_LLD_PATH"}
    result = _check(monkeypatch, script, environ)
    assert result.metrics["missing"] == [
        f"ld.lld (TRITON_HIP_LLD_PATH={root}/llvm/bin/ld.lld is no file named ld.lld)"
    ]


def test_reasons_word_for_word_when_several_things_are_wrong(monkeypatch, tmp_path):
    root = make_tree(tmp_path / "dtk-26.04", ("lib/libamdhip64.so.6", "llvm/bin/ld.lld"))
    script = tmp_path / "env.sh"
    script.write_text(f"export ROCM_PATH={root}\nexport HIP_PATH={root}\n")
    result = _check(monkeypatch, script, {"ROCM_PATH": "/opt/rocm", "HIP_PATH": "/opt/rocm"})
    assert result.reason == (
        f"DTK environment is stale (not what {script} sets now): "
        f"HIP_PATH='/opt/rocm', the script sets '{root}'; "
        f"ROCM_PATH='/opt/rocm', the script sets '{root}'; "
        "source the cell's script again (a base image's or an older DTK's variables); "
        f"DTK tree {root} lacks: hipcc (bin/hipcc or hip/bin/hipcc); device libraries "
        "(amdgcn/bitcode/ocml.bc or lib/llvm/amdgcn/bitcode/ocml.bc or "
        "llvm/amdgcn/bitcode/ocml.bc)"
    )
    assert dtk_env.judge_all(["a", None, "b"]) == "a; b"


def test_a_search_path_lost_entirely_is_named(monkeypatch, dtk):
    _, script = dtk
    environ = {k: v for k, v in sourced_environ(script).items() if k != "LD_LIBRARY_PATH"}
    result = _check(monkeypatch, script, environ)
    assert result.status == "fail"
    assert "LD_LIBRARY_PATH lacks " in result.reason


def test_only_what_the_script_changed_counts_as_exported():
    clean = {"PATH": "/usr/bin:/bin"}
    assert dtk_env.exported_by({"PATH": "/usr/bin:/bin", "A": "1"}, clean) == {"A": "1"}
    # Of a search path, only the entries the script added (the clean shell's own are not its).
    assert dtk_env.exported_by({"PATH": "/x:/usr/bin:/bin"}, clean) == {"PATH": "/x"}
    assert dtk_env.exported_by({"PATH": "/usr/bin:/bin"}, clean) == {}


@pytest.mark.parametrize(("found", "cell", "same"), [
    ("26.04", "26.04", True), ("26.04.1", "26.04", True), ("26.04", "26.04.1", True),
    ("26.0", "26.04", False), ("24.04", "26.04", False),
])
def test_a_patch_release_matches_either_way(found, cell, same):
    assert (dtk_env.judge_version({"ROCM_PATH": found}, cell) is None) is same


def test_version_from_the_name_when_the_target_has_none(tmp_path):
    target = make_tree(tmp_path / "data" / "tree")
    link = tmp_path / "dtk-26.04"
    link.symlink_to(target)
    assert dtk_env.versions_in_paths({"ROCM_PATH": str(link)}) == {"ROCM_PATH": "26.04"}


def test_env0_values_keep_equals_signs_and_bytes_that_are_not_utf8():
    assert dtk_env.parse_env0(b"A=b=c\0B=\xff\0") == {"A": "b=c", "B": "\ufffd"}


def test_script_that_hangs_fails_at_the_time_limit(monkeypatch, tmp_path):
    monkeypatch.setattr(dtk_env, "SOURCE_TIMEOUT_S", 0.5)
    script = tmp_path / "env.sh"
    script.write_text("sleep 5\n")
    with pytest.raises(dtk_env.SourceError) as failed:
        dtk_env.source_script(str(script))
    assert str(failed.value).startswith(
        f"sourcing {script} in a clean shell failed: TimeoutExpired: ")


def test_a_failing_script_quotes_its_last_two_lines_even_not_utf8(monkeypatch, tmp_path):
    script = tmp_path / "env.sh"
    script.write_text("echo one >&2\necho two >&2\nprintf 'three \\377\\n' >&2\nexit 4\n")
    with pytest.raises(dtk_env.SourceError) as failed:
        dtk_env.source_script(str(script))
    assert str(failed.value) == f"sourcing {script} in a clean shell exited 4: two three \ufffd"
# --- L0.path: the base image's PATH kept -------------------------------------------------


def test_l0_path_names_each_lost_base_entry_and_what_it_held():
    reason = level0.judge_path("/opt/stackpin/venv/bin:/usr/bin:/bin",
                               "/opt/dtk/bin:/opt/hyhal/bin:/usr/bin:/bin",
                               {"/opt/hyhal/bin": ["hy-smi"]})
    assert reason is not None
    assert "/opt/hyhal/bin (hy-smi)" in reason and "/opt/dtk/bin (empty here)" in reason
    assert level0.judge_path("/opt/stackpin/venv/bin:/opt/dtk/bin:/opt/hyhal/bin:/usr/bin:/bin",
                             "/opt/dtk/bin:/opt/hyhal/bin:/usr/bin:/bin", {}) is None


def test_l0_path_fails_an_image_that_set_path_and_skips_one_that_records_none(tmp_path):
    tools = tmp_path / "hyhal"
    tools.mkdir()
    (tools / "hy-smi").write_text("")
    failed = run_check("L0.path", functools.partial(
        level0.check_path, {"PATH": "/usr/bin", level0.BASE_PATH_ENV: f"{tools}:/usr/bin"}))
    assert failed.status == "fail" and f"{tools} (hy-smi)" in failed.reason
    skipped = run_check("L0.path", functools.partial(level0.check_path, {"PATH": "/usr/bin"}))
    assert skipped.status == "skip"


def test_a_script_extending_the_shells_path_passes_without_the_shells_own_entries(
        monkeypatch, tmp_path):
    # `export PATH=$ROCM_PATH/bin:$PATH` in a clean shell extends bash's built-in default,
    # which ends in "."; a process never holds that entry, and it is not the script's.
    root = make_tree(tmp_path / "dtk-26.04")
    script = write_script(tmp_path / "env.sh", root)
    environ = {"HOME": "/root", "ROCM_PATH": str(root), "HIP_PATH": str(root),
               "LD_LIBRARY_PATH": f"{root}/lib",
               "TRITON_HIP_LLD_PATH": f"{root}/llvm/bin/ld.lld",
               "PATH": f"/opt/stackpin/venv/bin:{root}/bin:{root}/llvm/bin:/usr/bin:/bin"}
    assert _check(monkeypatch, script, environ).status == "pass"
    environ["PATH"] = "/opt/stackpin/venv/bin:/usr/bin:/bin"  # the script's entries lost
    failed = _check(monkeypatch, script, environ)
    assert failed.status == "fail" and f"PATH lacks {root}/bin:{root}/llvm/bin" in failed.reason
