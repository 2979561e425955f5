"""Stable versus enhanced in `report grid` and `verify diff` (issue 20): the report's
recommendation read, shown in every grid format and compared between two reports."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.conftest import ROOT
from tests.golden_files import assert_golden
from tests.synthetic import synthetic_cells

from stackpin import comparison, reports
from stackpin import grid as gridlib
from stackpin.cli.main import cli
from stackpin.errors import VerificationError

FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "reports"
# Hand-written to the report contract (its numbers inside the range issue 20 measured for
# FlashAttention 2 on an H200); its recommendation was computed by the suite's own
# recommend.recommend from its checks.
H200 = "cuda-h200-enhanced-fa2.json"
CPU = "cpu-default-stable.json"
ROW = "cuda128-sm90-torch280-py312/enhanced~host"  # its lock digest says hand-written
NOTE = (
    "NOTE: use the stable variant here: the enhanced variant is no gain, it is slower than "
    "stable on this device (LoRA training step 1.13x)"
)


def _data(name: str = H200) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return loaded


def _grid(*names: str) -> reports.Grid:
    rows = [reports.parse_report(n, (FIXTURES / n).read_text(encoding="utf-8")) for n in names]
    return reports.build_grid(rows, synthetic_cells())


@pytest.mark.parametrize("name", sorted(gridlib.OUTPUTS))
def test_golden_grid_with_a_recommendation_in_every_format(name):
    assert_golden(f"ci/grid-recommendation/{name}", gridlib.render_all(_grid(CPU, H200))[name])


def test_the_row_carries_the_choice_ratio_and_note():
    row = next(r for r in _grid(H200).rows if r.id == ROW)
    assert row.advice is not None
    assert row.advice.choice == "stable"
    assert row.advice.ratio == pytest.approx(13.47 / 11.92)
    assert row.advice.note == NOTE
    assert row.advice.short == "stable (1.13x) NOTE"
    assert row.numbers["enhanced_over_stable"] == pytest.approx(13.47 / 11.92)


def test_every_format_shows_the_line_and_the_note():
    outputs = gridlib.render_all(_grid(CPU, H200))
    line = _data()["recommendation"]["line"]
    md = outputs["grid.md"].splitlines()
    at = md.index(f"- cuda128-sm90-torch280-py312 / enhanced (host stack): {line}")
    assert md[at + 1] == f"  **{NOTE}**"
    assert f"<strong class=\"note\">{NOTE}</strong>" in outputs["grid.html"]
    rows = {r["id"]: r for r in json.loads(outputs["grid.json"])["rows"]}
    assert rows[ROW]["recommendation"] == {"choice": "stable", "line": line, "note": NOTE}
    assert rows["cpu-bookworm-torch2130-py311/stable"]["recommendation"] is None
    suites = ET.fromstring(outputs["grid.xml"]).findall("testsuite")
    suite = next(s for s in suites if s.get("name") == "cuda128-sm90-torch280-py312 / enhanced (host stack)")
    prop = suite.find("properties/property[@name='recommendation']")
    assert prop is not None and prop.get("value") == line
    slower = suite.find("testcase[@name='L5.variants.train_step']/failure")
    assert slower is not None and slower.get("message", "").startswith("enhanced is slower here")


def test_a_report_without_a_recommendation_shows_none():
    outputs = gridlib.render_all(_grid(CPU))
    assert "Stable versus enhanced" not in outputs["grid.md"]
    assert "Stable versus enhanced" not in outputs["grid.html"]
    rows = json.loads(outputs["grid.json"])["rows"]
    assert all(r["recommendation"] is None for r in rows)


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("choice", "faster", "'faster' is not one of enhanced, stable, either, unsupported"),
    ("line", 7, "is int, not a string"),
    ("enhanced_over_stable", "1.1", "not a number"),
])
def test_a_malformed_recommendation_is_refused_in_one_line(field, value, problem):
    data = _data()
    data["recommendation"][field] = value
    with pytest.raises(VerificationError) as info:
        reports.load_report("r.json", json.dumps(data))
    assert problem in info.value.message
    assert "\n" not in info.value.message


def test_a_rising_ratio_against_the_baseline_is_a_regression():
    old = _data()
    old["recommendation"]["enhanced_over_stable"] = 0.88
    baseline_grid = reports.build_grid([reports.parse_report("old.json", json.dumps(old))], {})
    baseline = comparison.parse_baseline("old/grid.json", gridlib.render_json(baseline_grid))
    grid = comparison.compare(_grid(H200), baseline, source="old", threshold=0.1)
    (change,) = [c for c in grid.changes if c.name == "enhanced_over_stable"]
    assert change.worse
    assert change.detail.startswith("0.88 -> 1.13 (+28.4%")


# --- verify diff ---------------------------------------------------------------------


def _diff(tmp_path: Path, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    paths = []
    for name, data in (("before.json", before), ("after.json", after)):
        (tmp_path / name).write_text(json.dumps(data), encoding="utf-8")
        paths.append(str(tmp_path / name))
    result = CliRunner().invoke(cli, ["verify", "diff", *paths])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_verify_diff_shows_the_choice_flip_and_the_deciding_ratio(tmp_path):
    before = copy.deepcopy(_data())
    before["recommendation"].update(choice="enhanced", enhanced_over_stable=0.88, note=None,
                                    line="enhanced: 12% faster here with flash-attn-4")
    lines = _diff(tmp_path, before, _data())
    line = _data()["recommendation"]["line"]
    assert f"choice   recommendation: enhanced -> stable ({line})" in lines
    assert "metric   recommendation.enhanced_over_stable: 0.88 -> 1.13 (x1.284)" in lines


def test_verify_diff_shows_a_recommendation_that_appeared(tmp_path):
    before = copy.deepcopy(_data())
    del before["recommendation"]
    lines = _diff(tmp_path, before, _data())
    assert any(x.startswith("choice   recommendation: - -> stable (stable: ") for x in lines)


def test_verify_diff_shows_the_per_check_ratios(tmp_path):
    before = copy.deepcopy(_data())
    step = next(c for c in before["checks"] if c["name"] == "L5.variants.train_step")
    step["metrics"]["enhanced_over_stable"] = 1.0
    lines = _diff(tmp_path, before, _data())
    assert any(x.startswith("metric   L5.variants.train_step.enhanced_over_stable: 1 -> 1.13")
               for x in lines)


def test_verify_diff_of_a_report_with_itself_shows_nothing(tmp_path):
    assert _diff(tmp_path, _data(), _data()) == [
        "no differences in statuses, versions or throughput"
    ]


# --- what ran: an image, a lock replayed on a device, a host's own stack ----------------


def test_a_replayed_lock_is_its_own_row_and_says_so():
    from pathlib import Path

    from stackpin.reports import parse_report

    evidence = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "h200-cuda-lock"
    row = parse_report("replay", (evidence / "enhanced" / "report.json").read_text())
    assert row.kind == "lock replayed on device"
    assert row.label == "cuda130-sm90-torch2110-py311 / enhanced (lock replayed on device)"
    assert row.id == "cuda130-sm90-torch2110-py311/enhanced~replay"  # never an image's row


def test_hand_written_image_info_on_a_host_is_a_host_stack():
    from stackpin.reports import run_kind

    assert run_kind({"lock_digest": "none: bare GPU host"}, "r") == "host stack"
    assert run_kind({"lock_digest": "ab" * 32}, "r") == "image"


def test_an_unknown_run_kind_is_refused():
    import pytest

    from stackpin.errors import VerificationError
    from stackpin.reports import run_kind

    with pytest.raises(VerificationError, match="run_kind 'image on a toaster'"):
        run_kind({"run_kind": "image on a toaster"}, "r")


def test_a_rehearsal_is_its_own_row_and_never_merges_with_the_image():
    from pathlib import Path

    from stackpin.reports import build_grid, parse_report

    evidence = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "h200-cuda-lock"
    data = json.loads((evidence / "enhanced" / "report.json").read_text())
    data["image"].pop("run_kind", None)
    image = parse_report("image", json.dumps(data))
    # image.json of a rehearsal image says so (stackpin.render); the report copies it whole.
    data["image"]["run_kind"] = "vendor rehearsal"
    rehearsed = parse_report("rehearsal", json.dumps(data))
    assert rehearsed.kind == "vendor rehearsal"
    assert rehearsed.id == f"{image.id}~rehearsal"
    assert rehearsed.label.endswith("(vendor rehearsal)")
    grid = build_grid([image, rehearsed], {})
    assert sorted(row.kind for row in grid.rows) == ["image", "vendor rehearsal"]


def test_a_rehearsal_report_that_drops_its_run_kind_is_still_a_rehearsal_or_refused():
    import pytest

    from stackpin.errors import VerificationError
    from stackpin.reports import run_kind

    image = {"lock_digest": "ab" * 32, "rehearsal": {"of": "dtk2604-k100-torch290-py310"}}
    assert run_kind(image, "r") == "vendor rehearsal"  # the run kind deleted by hand
    with pytest.raises(VerificationError, match=r"image\.rehearsal is set"):
        run_kind({**image, "run_kind": "image"}, "r")  # or changed to pass as an image
