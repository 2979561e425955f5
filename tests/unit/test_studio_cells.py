"""Studio in every DTK and ROCm cell (issue 21, item 1): the shipped cells and the rules."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stackpin.checks import Violation, check_cell
from stackpin.lock import read_lock, stale_reason
from stackpin.matrix import Cell, cell_to_dict
from stackpin.matrixfile import load_cells
from stackpin.servicespec import Service, ServiceBlocker

ROOT = Path(__file__).resolve().parents[2]
STUDIO = "2026.10.9"
PRODUCT_CELLS = {
    "dtk2604-k100-torch290-py310", "dtk2604-bw-torch2100-py310", "rocm64-gfx942-torch280-py312",
}
BLOCKED_CELLS = {"dtk2404-torch210-py310"}


@pytest.fixture(scope="module")
def shipped() -> dict[str, Cell]:
    return load_cells(sorted((ROOT / "pinning").glob("*.toml")))


def studio_findings(cell: Cell) -> list[Violation]:
    return [v for v in check_cell(cell)
            if v.field.startswith(("service", "stack.unsloth"))]


def test_every_dtk_and_rocm_cell_serves_studio_or_is_blocked(shipped):
    product = {c.id for c in shipped.values() if c.platform in ("dtk", "rocm")}
    assert product == PRODUCT_CELLS | BLOCKED_CELLS
    for cell_id in PRODUCT_CELLS:
        cell = shipped[cell_id]
        assert cell.service is not None and cell.service_blocked is None
        assert studio_findings(cell) == []


@pytest.mark.parametrize("cell_id", sorted(PRODUCT_CELLS))
def test_each_product_lock_is_current_and_holds_the_studio_release(shipped, cell_id):
    cell = shipped[cell_id]
    lock = read_lock(ROOT, cell_id)
    assert lock is not None and stale_reason(lock, cell) is None
    locked = {w.name: w.version for w in lock.wheels}
    assert locked["unsloth"] == STUDIO and locked["unsloth-zoo"] == STUDIO
    # The vendor torch stays the vendor's: the resolver never swapped in an index torch.
    assert locked["torch"] == cell.provided["torch"].version


@pytest.mark.parametrize("cell_id", sorted(PRODUCT_CELLS))
def test_both_variants_keep_the_seed_endpoints_and_state_apart(shipped, cell_id):
    service = shipped[cell_id].service
    assert service is not None
    assert (service.stable.port, service.stable.tools) == (18888, False)
    assert (service.enhanced.port, service.enhanced.tools) == (18887, True)


def test_the_blocked_cell_says_which_requirement_blocks_it_in_one_line(shipped):
    (line,) = studio_findings(shipped["dtk2404-torch210-py310"])
    assert line.severity == "warning"
    assert "\n" not in str(line)
    assert "unsloth 2026.10.9 requires torch>=2.4.0,<2.15.0" in str(line)
    assert "this cell has 2.1.0+das.opt2.dtk24043" in str(line)


def test_a_blocker_that_no_longer_blocks_is_an_error(shipped):
    served = shipped["dtk2604-k100-torch290-py310"]
    stale = dataclasses.replace(served, service=None, service_blocked=ServiceBlocker(
        of="unsloth 2026.10.9", requirement="torch>=2.4.0,<2.15.0"))
    (found,) = studio_findings(stale)
    assert found.severity == "error"
    assert "holds for torch 2.9.0+das.opt1.dtk2604" in found.found


@pytest.mark.parametrize(("requirement", "found"), [
    ("torch >= >= 2", "'torch >= >= 2'"),
    ("vllm>=0.18", "none"),
])
def test_a_blocker_the_cell_cannot_be_checked_against_is_an_error(shipped, requirement, found):
    cell = dataclasses.replace(shipped["dtk2404-torch210-py310"],
                               service_blocked=ServiceBlocker(of="x 1", requirement=requirement))
    (violation,) = studio_findings(cell)
    assert (violation.severity, violation.field, violation.found) == (
        "error", "service_blocked.requirement", found)


def test_both_declarations_at_once_are_an_error(shipped):
    cell = dataclasses.replace(shipped["dtk2404-torch210-py310"], service=Service())
    fields = {(v.field, v.severity) for v in studio_findings(cell)}
    assert ("service_blocked", "error") in fields


def test_a_dtk_cell_with_neither_is_warned_a_cpu_cell_is_not(shipped):
    dtk = dataclasses.replace(shipped["dtk2604-k100-torch290-py310"], service=None)
    (warned,) = studio_findings(dtk)
    assert (warned.field, warned.severity) == ("service", "warning")
    cpu = dataclasses.replace(shipped["cpu-bookworm-torch2130-py311"], service=None)
    assert studio_findings(cpu) == []


@pytest.mark.parametrize("stack_unsloth", [None, "2025.10.12"])
def test_a_service_without_a_studio_bearing_unsloth_is_an_error(shipped, stack_unsloth):
    cell = shipped["dtk2604-k100-torch290-py310"]
    stack = {k: v for k, v in cell.stack.items() if k != "unsloth"}
    if stack_unsloth is not None:
        stack["unsloth"] = stack_unsloth
    (violation,) = studio_findings(dataclasses.replace(cell, stack=stack))
    assert (violation.field, violation.severity) == ("stack.unsloth", "error")


def test_a_cell_that_declares_neither_keeps_its_digest_form(shipped):
    # Every shipped cell serves Studio or says why not; a tool-only cell is made here.
    form = cell_to_dict(dataclasses.replace(shipped["cuda130-sm90-torch2110-py311"],
                                            service=None))
    assert "service" not in form and "service_blocked" not in form
    assert "service_blocked" in cell_to_dict(shipped["dtk2404-torch210-py310"])
