"""The build guard (templates/guard.py): it must fail a build whose environment is not the pins."""

from __future__ import annotations

import ast
import atexit
import functools
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import verify_helpers  # noqa: F401 - puts verify/ on sys.path
from hypothesis import given
from hypothesis import strategies as st
from packaging.utils import canonicalize_name
from tests.conftest import ROOT

from stackpin_verify import boundary

GUARD = ROOT / "templates" / "guard.py"
# In the image the guard imports boundary.py from beside itself (the Dockerfile copies it
# there); here it gets the same file, verify's module.
sys.modules.setdefault("boundary", boundary)
spec = importlib.util.spec_from_file_location("stackpin_guard", GUARD)
assert spec is not None and spec.loader is not None
guard = importlib.util.module_from_spec(spec)
spec.loader.exec_module(guard)

RUNNING = f"cp{sys.version_info.major}{sys.version_info.minor}"


@functools.cache
def staged_guard() -> Path:
    """guard.py with boundary.py beside it, as the Dockerfile stages them in /opt/stackpin."""
    folder = Path(tempfile.mkdtemp(prefix="stackpin-guard-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    shutil.copy(GUARD, folder / "guard.py")
    shutil.copy(boundary.__file__, folder / "boundary.py")
    return folder / "guard.py"


@pytest.mark.parametrize(
    ("version", "constraint", "expected"),
    [
        ("1.26.4", "<2", True),
        ("2.0.0", "<2", False),
        ("2.2.6", "<3", True),
        ("1.26.4", ">=1.24,<2", True),
        ("1.23.5", ">=1.24,<2", False),
        ("1.26.4", "==1.26.4", True),
        ("1.26", "==1.26.0", True),
        ("2.0.0rc1", "<2", False),
    ],
)
def test_satisfies(version: str, constraint: str, expected: bool):
    assert guard.satisfies(version, constraint) is expected


def test_unreadable_constraint_stops_the_build():
    with pytest.raises(SystemExit, match="cannot read numpy constraint"):
        guard.satisfies("1.26.4", "~=1.26")


def test_matching_environment_has_no_problems():
    import numpy
    import torch

    assert guard.problems(RUNNING, torch.__version__, f"=={numpy.__version__}") == []


def test_swapped_torch_is_named():
    found = guard.problems(RUNNING, "2.9.0+das.opt1.dtk2604", "<3")
    assert len(found) == 1
    assert "the cell pins 2.9.0+das.opt1.dtk2604" in found[0]


def test_numpy_outside_constraint_and_wrong_python_are_named():
    import torch

    found = guard.problems("cp39", torch.__version__, "<1")
    assert any("the cell pins cp39" in line for line in found)
    assert any("requires numpy<1" in line for line in found)


def test_guard_script_exits_1_with_one_line_per_problem():
    result = subprocess.run(
        [sys.executable, str(staged_guard()), "--python", RUNNING, "--torch", "0.0.1+other", "--numpy", "<3"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"stackpin guard: torch is {__import__('torch').__version__}, the cell pins 0.0.1+other (a wheel was swapped)"
    ]


IMAGE = {
    "provided": {"torch": {"version": "2.9.0+das.opt1.dtk2604", "by": "vendor-wheel"},
                 "triton": {"version": "3.5.0+das.opt1.dtk2604", "by": "vendor-wheel"}},
    "excluded": {"bitsandbytes": "no native build"},
}


def test_boundary_holds_with_the_vendor_builds_and_nothing_excluded():
    installed = {"torch": "2.9.0+das.opt1.dtk2604", "triton": "3.5.0+das.opt1.dtk2604"}
    assert guard.boundary_problems(IMAGE, installed) == []


def test_boundary_names_an_excluded_distribution_with_its_reason():
    installed = {"torch": "2.9.0+das.opt1.dtk2604", "triton": "3.5.0+das.opt1.dtk2604",
                 "bitsandbytes": "0.47.0"}
    assert guard.boundary_problems(IMAGE, installed) == [
        "bitsandbytes 0.47.0 is installed but excluded here (no native build)"]


def test_boundary_catches_an_index_triton_that_replaced_the_vendors():
    installed = {"torch": "2.9.0+das.opt1.dtk2604", "triton": "3.5.0"}
    (problem,) = guard.boundary_problems(IMAGE, installed)
    assert problem.startswith("triton is 3.5.0, not the vendor's 3.5.0+das.opt1.dtk2604")


def test_boundary_catches_a_missing_vendor_distribution():
    (problem,) = guard.boundary_problems(IMAGE, {"torch": "2.9.0+das.opt1.dtk2604"})
    assert problem.startswith("triton is missing; the vendor's 3.5.0+das.opt1.dtk2604")


def test_guard_cli_reads_the_boundary_from_image_json(tmp_path: Path):
    image = tmp_path / "image.json"
    image.write_text('{"excluded": {"pytest": "test: excluded here"}}')
    torch = guard.metadata.version("torch")
    numpy = guard.metadata.version("numpy")
    result = subprocess.run(
        [sys.executable, str(staged_guard()), "--python", RUNNING, "--torch", torch,
         "--numpy", f"=={numpy}", "--boundary", str(image)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 1
    assert "pytest" in result.stderr and "is installed but excluded here (test: excluded here)" in result.stderr


PIP_CHECK = """unsloth 2026.10.9 requires torchvision, which is not installed.
unsloth 2026.10.9 requires xformers, which is not installed.
cut-cross-entropy 25.1.1 requires triton, which is not installed.
trl 0.23.1 has requirement transformers>=4.56.1, but you have transformers 4.40.0.
"""
DROPPED = {"dropped": [{"of": "unsloth", "requirement": "torchvision", "reason": "r"},
                       {"of": "unsloth", "requirement": "xformers", "reason": "r"},
                       {"of": "Cut_Cross_Entropy", "requirement": "Triton", "reason": "r"}]}


def test_pip_check_allows_exactly_the_dropped_requirements():
    found = guard.pip_check_problems(PIP_CHECK, guard.dropped_edges(DROPPED))
    assert found == ["pip check: trl 0.23.1 has requirement transformers>=4.56.1, "
                     "but you have transformers 4.40.0."]


def test_pip_check_reports_a_requirement_dropped_for_another_distribution():
    # triton is dropped for cut-cross-entropy only: the same requirement of unsloth_zoo fails.
    text = "unsloth-zoo 2026.10.9 requires triton, which is not installed.\n"
    assert guard.pip_check_problems(text, guard.dropped_edges(DROPPED)) == [
        "pip check: unsloth-zoo 2026.10.9 requires triton, which is not installed."]


def test_pip_check_reports_a_missing_requirement_that_is_not_dropped():
    edges = guard.dropped_edges({"dropped": DROPPED["dropped"][:1]})
    found = guard.pip_check_problems(PIP_CHECK, edges)
    assert any("requires xformers" in line for line in found)
    assert not any("torchvision" in line for line in found)
    assert guard.pip_check_problems("No broken requirements found.\n", set()) == []


def test_the_guard_runs_real_pip_check_and_drops_only_the_named_edge(tmp_path: Path, monkeypatch):
    # A distribution whose requirement is missing, put on the path of the pip the guard runs:
    # pip check must report it, and naming that edge in image.json's dropped list hides it.
    dist = tmp_path / "needy-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: needy\nVersion: 1.0\n"
                                   "Requires-Dist: absent-thing\n")
    (dist / "RECORD").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    line = "pip check: needy 1.0 requires absent-thing, which is not installed."
    assert line in guard.pip_check_problems(guard.run_pip_check(), set())
    image = {"dropped": [{"of": "needy", "requirement": "absent_thing", "reason": "r"}]}
    assert line not in guard.pip_check_problems(guard.run_pip_check(), guard.dropped_edges(image))


# --- one name rule: PEP 503's, written out in boundary.py (an image need not hold packaging)


@pytest.mark.parametrize("name", ["Foo__Bar.baz", "a__b", "A.B-_c", "torch", "flash_attn",
                                  "----", "", "Unsloth_Zoo", "x..y--z__w"])
def test_the_name_rule_is_packagings(name):
    assert boundary.canonical_name(name) == canonicalize_name(name)


@given(st.text(alphabet="AbZz09-_.", max_size=24))
def test_the_name_rule_is_packagings_for_any_name(name):
    assert boundary.canonical_name(name) == canonicalize_name(name)


def test_the_boundary_module_needs_nothing_but_the_standard_library():
    tree = ast.parse(Path(boundary.__file__).read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and not node.level}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_the_guard_and_l0_judge_a_swapped_build_with_the_same_words():
    installed = {"torch": "2.9.0+das.opt1.dtk2604", "triton": "3.5.0", "bitsandbytes": "0.47.0"}
    from_guard = guard.boundary_problems(IMAGE, installed)
    from_l0 = boundary.judge_boundary(IMAGE["provided"], IMAGE["excluded"], installed.get)
    assert from_l0 == "; ".join(from_guard) and len(from_guard) == 2
# --- the env script: sourced in the build step, by verify's own rule (L0.dtk_env) ----------


def _guard_with_dtk_env(tmp_path: Path) -> Path:
    """guard.py with dtk_env.py and boundary.py beside it, as the Dockerfile copies them into
    /opt/stackpin."""
    folder = tmp_path / "opt-stackpin"
    folder.mkdir()
    (folder / "guard.py").write_text(GUARD.read_text())
    for name in ("dtk_env.py", "boundary.py"):  # both beside it, as in the image
        (folder / name).write_text((ROOT / "verify" / "stackpin_verify" / name).read_text())
    return folder / "guard.py"


def _env_guard(guard_py: Path, script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import torch

    return subprocess.run(
        [sys.executable, str(guard_py), "--python", RUNNING, "--torch", torch.__version__,
         "--numpy", "<3", "--env-script", str(script)],
        capture_output=True, text=True, check=False, env=env)


def test_a_build_step_that_did_not_source_the_env_script_fails_the_guard(tmp_path: Path):
    import os

    script = tmp_path / "env.sh"
    script.write_text("export ROCM_PATH=/opt/dtk\nexport PATH=/opt/dtk/bin:$PATH\n")
    guard_py = _guard_with_dtk_env(tmp_path)
    plain = {k: v for k, v in os.environ.items() if k != "ROCM_PATH"}
    done = _env_guard(guard_py, script, plain)
    assert done.returncode == 1
    assert "this build step did not source the env script" in done.stderr
    assert "never sourced" in done.stderr and "ROCM_PATH" in done.stderr
    sourced = {**plain, "ROCM_PATH": "/opt/dtk", "PATH": f"/opt/dtk/bin:{plain['PATH']}"}
    assert _env_guard(guard_py, script, sourced).returncode == 0
    # Another release's value is not "sourced" either.
    stale = {**sourced, "ROCM_PATH": "/opt/dtk-24.04"}
    assert "stale" in _env_guard(guard_py, script, stale).stderr
