"""Compatibility shims: the cell's declaration, the files it renders, and the hook that
applies them, run by a real interpreter against stand-ins of the upstream modules.

The stand-ins copy the upstream signatures the shims bridge (trl's SFTConfig takes
max_length only; unsloth_zoo's FastCPUModel forwards unknown keywords to a model class that
rejects them); the image's own upstream code is exercised by
tests/integration/test_compat_cpu.py.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stackpin.compat import compat_files, compat_problems
from stackpin.context import read_sources
from stackpin.errors import ConfigurationError
from stackpin.matrix import Cell, cell_to_dict

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"
CPU_CELL = "cpu-bookworm-torch2130-py311"

SFT_CONFIG = '''
import dataclasses
@dataclasses.dataclass
class SFTConfig:
    output_dir: str = ""
    max_length: int = 1024
'''
CPU_LOADER = '''
class Qwen2ForCausalLM:
    def __init__(self, **kwargs):
        if kwargs:
            raise TypeError(f"Qwen2ForCausalLM.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}")
class FastCPUModel:
    @staticmethod
    def from_pretrained(model_name="unsloth/Llama-3.2-1B-Instruct", max_seq_length=2048, **kwargs):
        return Qwen2ForCausalLM(**kwargs), model_name
'''
USE = '''
import runpy, sys
runpy.run_path(sys.argv[1])
from trl.trainer.sft_config import SFTConfig
print("max_length", SFTConfig(output_dir="o", max_seq_length=64).max_length)
from unsloth_zoo.cpu.loader import FastCPUModel
seen = []
print("model", FastCPUModel.from_pretrained("/models/tiny", on_model_resolved=seen.append)[1])
print("resolved", seen)
import stackpin_compat
print("applied", sorted(stackpin_compat.applied))
'''


@pytest.fixture
def image(tmp_path: Path, shipped_cells: dict[str, Cell]) -> Path:
    """The CPU cell's shim files laid out as in /opt/stackpin, and the upstream stand-ins."""
    for rel, text in _files(shipped_cells[CPU_CELL], TEMPLATES).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for rel, text in (("trl/__init__.py", ""), ("trl/trainer/__init__.py", ""),
                      ("trl/trainer/sft_config.py", SFT_CONFIG), ("unsloth_zoo/__init__.py", ""),
                      ("unsloth_zoo/cpu/__init__.py", ""), ("unsloth_zoo/cpu/loader.py", CPU_LOADER)):
        (tmp_path / "site" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / rel).write_text(text)
    return tmp_path


def _use(image: Path, off: str = "") -> subprocess.CompletedProcess[str]:
    hook = image / "stackpin" / "compat" / "hook.py"
    return subprocess.run([sys.executable, "-c", USE, str(hook)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(image / "site"), "STACKPIN_COMPAT_OFF": off},
                          timeout=60, check=False)


def test_the_hook_applies_each_shim_once_its_module_loads(image):
    done = _use(image)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "max_length 64", "model /models/tiny", "resolved ['/models/tiny']",
        "applied ['trl-sftconfig-max-seq-length', 'unsloth-zoo-cpu-on-model-resolved']"]


@pytest.mark.parametrize(("off", "failure"), [
    ("trl-sftconfig-max-seq-length", "unexpected keyword argument 'max_seq_length'"),
    ("all", "unexpected keyword argument 'max_seq_length'"),
])
def test_switched_off_the_defect_returns(image, off, failure):
    done = _use(image, off)
    assert done.returncode != 0
    assert failure in done.stderr


def test_without_the_loader_shim_the_model_class_rejects_the_keyword(image):
    done = _use(image, "unsloth-zoo-cpu-on-model-resolved")
    assert done.returncode != 0
    assert "got an unexpected keyword argument 'on_model_resolved'" in done.stderr


def test_the_sftconfig_bridge_refuses_two_different_lengths(image):
    script = ("import runpy, sys; runpy.run_path(sys.argv[1])\n"
              "from trl.trainer.sft_config import SFTConfig\n"
              "SFTConfig(max_seq_length=64, max_length=128)\n")
    done = subprocess.run([sys.executable, "-c", script,
                           str(image / "stackpin" / "compat" / "hook.py")],
                          capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(image / "site")}, timeout=60)
    assert "max_seq_length=64 and max_length=128 disagree" in done.stderr


def test_the_pth_file_starts_the_hook_from_the_venv(shipped_cells):
    files = _files(shipped_cells[CPU_CELL], TEMPLATES)
    pth = files["stackpin/venv/lib/python3.11/site-packages/stackpin-compat.pth"]
    assert pth == "import runpy; runpy.run_path('/opt/stackpin/compat/hook.py')\n"
    assert _files(replace(shipped_cells[CPU_CELL], compat={}), TEMPLATES) == {}


def test_a_shim_tied_to_another_version_than_the_pin_is_a_problem(shipped_cells):
    cell = shipped_cells[CPU_CELL]
    assert compat_problems(cell.compat, cell.stack) == []
    bumped = replace(cell, stack={**cell.stack, "trl": "0.24.0"})
    (problem,) = compat_problems(bumped.compat, bumped.stack)
    assert problem[0] == "compat.trl-sftconfig-max-seq-length.version"
    assert "check whether the defect is still there" in problem[1]


def test_a_shim_without_its_file_is_refused_at_render(shipped_cells, tmp_path):
    (tmp_path / "compat").mkdir()
    (tmp_path / "compat" / "hook.py").write_text("")
    with pytest.raises(ConfigurationError, match="has no file"):
        _files(shipped_cells[CPU_CELL], tmp_path)


def test_cells_without_shims_keep_the_form_their_locks_were_digested_from(shipped_cells):
    assert "compat" not in cell_to_dict(shipped_cells["dtk2404-torch210-py310"])
    assert set(cell_to_dict(shipped_cells[CPU_CELL])["compat"]) == {
        "trl-sftconfig-max-seq-length", "unsloth-zoo-cpu-on-model-resolved"}


def _files(cell, templates):  # type: ignore[no-untyped-def]
    return compat_files(cell.compat, python_tag=cell.python,
                        sources=read_sources(templates).templates)
