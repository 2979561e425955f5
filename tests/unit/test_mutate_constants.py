"""scripts/mutate_constants.py: the tolerance constants mutmut cannot reach (issue 22)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("mutate_constants",
                                                  ROOT / "scripts" / "mutate_constants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate_constants"] = module
    spec.loader.exec_module(module)
    return module


def test_every_numeric_constant_of_a_scored_module_is_classified(harness):
    """A tolerance added without being named here would never be mutated."""
    assert harness.unclassified() == []


def test_each_target_value_gets_both_directions(harness):
    found = harness.mutants()
    names = {m.name for m in found}
    for key, (ops, _) in harness.TARGETS.items():
        for op in ops:
            assert any(n.startswith(key) and n.endswith(f" {op}") for n in names), (key, op)
    # Per dtype, one value at a time.
    assert "level1.TOLERANCE['bf16'] x2" in names
    assert "capability.CUDA_BF16_CAPABILITY[0] -1" in names
    assert not any(m.op in harness.ULP for m in found)
    assert any(m.op == "+ulp" for m in harness.mutants(ulp=True))


def test_a_mutant_changes_exactly_its_value_and_the_module_still_parses(harness):
    [mutant] = [m for m in harness.mutants() if m.name == "golden.FACTOR['fp16'] /2"]
    source = (harness.PACKAGE / "golden.py").read_text(encoding="utf-8")
    changed = harness.apply(source, mutant)
    before = harness.module_constants("golden")["FACTOR"]
    after = next(node.value for node in ast.parse(changed).body
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "FACTOR")
    assert ast.literal_eval(after) == {**ast.literal_eval(before), "fp16": 8.0}
    assert len(changed.splitlines()) == len(source.splitlines())
    [negative] = [m for m in harness.mutants()
                  if m.name == "attention_range.VALUE_SCALES['bf16'][1] x2"]
    text = harness.apply((harness.PACKAGE / "attention_range.py").read_text(), negative)
    scales = next(node.value for node in ast.parse(text).body if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", "") == "VALUE_SCALES")
    assert ast.literal_eval(scales)["bf16"] == (64, -126, 120)


def test_integer_exponents_stay_integers(harness):
    assert harness.mutate_value(-63, "/2") == -31
    assert harness.mutate_value(7, "/2") == 3
    assert harness.mutate_value(0.25, "/2") == 0.125


def test_readers_are_found_in_the_module_and_where_it_is_imported(harness):
    readers = harness.readers("attention", "FACTOR")
    assert "stackpin_verify.attention.x_compare_attention" in readers  # default argument
    assert "stackpin_verify.attention_range.x_compare_forward" in readers  # imported by name
    level4 = harness.direct_tests("level4", "TOLERANCE")
    assert any("test_l4_tolerances_reject" in t for t in level4)


def test_the_tests_no_mutation_run_selects_are_left_out_of_every_run(harness, monkeypatch):
    """One home (mutation_score.LEFT_OUT) for mutmut's run, the GPU pre-check and this
    harness: on the H200 these subprocess tests are red before any mutation, and the
    constants run once refused to start on them."""
    seen: list[list[str]] = []

    def run(command, **kwargs):
        seen.append(command)
        return harness.subprocess.CompletedProcess(command, 0, "1 passed", "")

    monkeypatch.setattr(harness.subprocess, "run", run)
    harness.run_tests(Path("/tmp/pkg"), ["tests/unit/test_verify_levels.py"], [], 60.0)
    (command,) = seen
    left_out = {c.removeprefix("--deselect=") for c in command if c.startswith("--deselect=")}
    assert left_out == set(harness.LEFT_OUT)
    assert "tests/unit/test_verify_cli.py" in left_out
    assert "tests/unit/test_verify_levels.py" in command
