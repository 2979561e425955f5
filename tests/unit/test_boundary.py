"""matrix check and the vendor boundary: each conflict class is one line, exit 4."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tests.conftest import K100_CELL, ROOT
from tests.unit.test_cli import project, run  # noqa: F401 (fixture)
from tests.unit.test_resolve import CELLS, Replay

from stackpin.checks import check_cell
from stackpin.cli.common import all_cells
from stackpin.cli.matrix_cmd import resolution_conflicts
from stackpin.resolve import Pip


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKPIN_CACHE_DIR", str(tmp_path / "cache"))


def test_conflict_class_pin_outside_a_dependencys_range(tmp_path: Path):
    cell = CELLS["pin-outside-range"]
    lines = [str(c) for c in resolution_conflicts([cell], tmp_path, Pip(runner=Replay(cell.id)))]
    assert ("pin-outside-range: unsloth 2025.10.12 requires transformers!=4.52.0,"
            in lines[0]) and lines[0].endswith("; the cell pins 4.57.6")


def test_conflict_class_excluded_distribution_pulled_in(tmp_path: Path):
    cell = CELLS["excluded-transitive"]
    (line,) = [str(c) for c in resolution_conflicts([cell], tmp_path,
                                                    Pip(runner=Replay(cell.id)))]
    assert line.endswith("→ idna: excluded on dtk (test: never installed here)")


def test_conflict_class_provided_version_differs_from_the_vendor_label():
    cell = all_cells(ROOT)[K100_CELL]
    torch = dataclasses.replace(cell.provided["torch"], version="2.9.0+das.opt2.dtk2604")
    moved = dataclasses.replace(cell, provided={**cell.provided, "torch": torch})
    errors = [str(v) for v in check_cell(moved) if v.severity == "error"]
    assert errors == [
        f"{K100_CELL}: provided.torch.version: expected 2.9.0+das.opt1.dtk2604 (the vendor "
        "wheel's label), found 2.9.0+das.opt2.dtk2604; "
        f"{cell.torch.filename} decides: pin one version in both places"
    ]


def test_vendor_wheel_without_a_provided_entry_warns_and_still_stands_in():
    from stackpin.boundary import effective_provided

    cell = all_cells(ROOT)[K100_CELL]
    bare = dataclasses.replace(cell, provided={k: v for k, v in cell.provided.items()
                                               if k != "torch"})
    assert [v.field for v in check_cell(bare) if v.severity == "error"] == []
    assert "provided" in [v.field for v in check_cell(bare) if v.severity == "warning"]
    # Undeclared, the vendor torch is still a placeholder: pip never fetches an index torch.
    assert effective_provided(bare)["torch"].version == "2.9.0+das.opt1.dtk2604"


def test_excluded_distribution_also_in_the_stack_is_an_error():
    cell = all_cells(ROOT)[K100_CELL]
    both = dataclasses.replace(cell, stack={**cell.stack, "xformers": "0.0.32"})
    fields = [v.field for v in check_cell(both) if v.severity == "error"]
    assert "excluded.xformers" in fields


def test_a_current_lock_is_a_resolution_no_pip_runs():
    def refuse(argv: list[str], on_line: object) -> int:
        msg = "pip must not run for a cell whose lock is current"
        raise AssertionError(msg)

    cells = list(all_cells(ROOT).values())
    assert resolution_conflicts(cells, ROOT, Pip(runner=refuse)) == []


def test_matrix_check_cli_reports_a_moved_pin_and_exits_4(project: Path, monkeypatch):  # noqa: F811
    monkeypatch.setattr("stackpin.cli.matrix_cmd.Pip", lambda: Pip(runner=Replay(
        "pin-outside-range")))
    matrix = (Path(__file__).parent.parent / "fixtures" / "resolver" / "cells.toml").read_text()
    (project / "moved.toml").write_text(matrix.split("[cells.excluded-transitive]")[0])
    result = run("matrix", "check", "moved.toml", cwd=project)
    assert result.exit_code == 4, result.output
    assert "ERROR pin-outside-range: unsloth 2025.10.12 requires transformers" in result.output
    assert "1 resolution conflict" in result.output or "resolution conflict(s)" in result.output


def test_visible_devices_are_named_for_the_platforms_runtime():
    from stackpin.matrix import RunFlags, visibility_environment

    run = RunFlags(visible_devices="0,1")
    assert visibility_environment("dtk", run) == {"HIP_VISIBLE_DEVICES": "0,1"}
    assert visibility_environment("rocm", run) == {"HIP_VISIBLE_DEVICES": "0,1"}
    assert visibility_environment("cuda", run) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert visibility_environment("dtk", RunFlags()) == {}


def test_visible_devices_must_be_a_plain_list():
    cell = all_cells(ROOT)[K100_CELL]
    from stackpin.matrix import pinned_wheels
    from stackpin.matrix_safety import cell_problems

    bad = dataclasses.replace(cell, run=dataclasses.replace(cell.run, visible_devices="0;rm"))
    found = [where for where, _message in cell_problems(bad, pinned_wheels(bad))]
    assert found == [f"cells.{K100_CELL}.run.visible_devices"], found
    assert list(cell_problems(cell, pinned_wheels(cell))) == []
