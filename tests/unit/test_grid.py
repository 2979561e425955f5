"""`stackpin report grid`: merged grid in four formats, not-run rows, baseline regressions."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.conftest import CPU_CELL, K100_CELL, ROOT
from tests.golden_files import assert_golden
from tests.synthetic import synthetic_cells
from tests.tools import need_tool

from stackpin import comparison, reports
from stackpin import grid as gridlib
from stackpin.cli.main import cli
from stackpin.errors import VerificationError

FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "reports"
# A real report: `PYTHONPATH=verify python -m stackpin_verify --out-dir DIR` (all levels)
# on a 2-core CPU host outside any image, so it is a bare-host row. The other two are
# hand-written to the report contract with the suite's check names: the CPU default image
# and a DTK K100 enhanced image with a failing FlashAttention case.
REAL = "real-cpu-bare-host.json"
CPU = "cpu-default-stable.json"
K100 = "dtk2604-k100-enhanced.json"
FAILING_CHECK = "L3.flash.varlen.hd128.noncausal"


def _row(name: str, folder: Path = FIXTURES) -> reports.Row:
    return reports.parse_report(name, (folder / name).read_text(encoding="utf-8"))


def _grid(shipped_cells, names=(REAL, CPU, K100)) -> reports.Grid:
    return reports.build_grid([_row(n) for n in names], shipped_cells)


def _by_id(grid: reports.Grid) -> dict[str, reports.Row]:
    return {r.id: r for r in grid.rows}


def _invoke(*args: str) -> object:
    return CliRunner().invoke(cli, ["report", "grid", *args, "--cells-from", str(ROOT / "pinning")])


# --- the grid ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(gridlib.OUTPUTS))
def test_golden_grid_from_three_reports_in_every_format(name):
    # Not-run rows come from the synthetic cells: a new or bumped shipped cell moves no golden.
    assert_golden(f"ci/grid/{name}", gridlib.render_all(_grid(synthetic_cells()))[name])


def test_rows_cover_every_shipped_cell_variant_and_unreported_ones_are_not_run(shipped_cells):
    grid = _grid(shipped_cells)
    rows = _by_id(grid)
    declared = {f"{c.id}/{v}" for c in shipped_cells.values() for v in c.variants}
    assert declared <= set(rows)
    assert rows["host:vm"].label == "vm (bare host)"
    for row_id in declared - {f"{CPU_CELL}/stable", f"{K100_CELL}/enhanced"}:
        row = rows[row_id]
        assert row.result == "not run"
        assert not row.checks  # nothing about it can read as a pass
    data = json.loads(gridlib.render_json(grid))
    not_run = [r for r in data["rows"] if r["result"] == "not run"]
    assert len(not_run) == len(declared) - 2
    assert all(r["counts"] == {"pass": 0, "fail": 0, "skip": 0} for r in not_run)


def test_columns_are_grouped_by_level_in_suite_order(shipped_cells):
    columns = _grid(shipped_cells).columns
    levels = [c.level for c in columns]
    assert levels == sorted(levels)
    assert set(levels) == set(range(8))
    gemm = [c.name for c in columns if c.name.startswith("L1.gemm.")]
    assert gemm == ["L1.gemm.fp32", "L1.gemm.fp16", "L1.gemm.bf16"]


def test_versions_and_key_numbers(shipped_cells):
    rows = _by_id(_grid(shipped_cells))
    k100 = rows[f"{K100_CELL}/enhanced"]
    assert k100.versions == {"torch": "2.9.0+das.opt1.dtk2604", "python": "3.10.12",
                             "numpy": "1.26.4", "transformers": "4.57.6"}
    assert k100.numbers["gemm_tflops"] == 98.1
    assert k100.gemm_check == "L1.gemm.fp16"
    assert k100.numbers["flash_vs_sdpa_math"] == 23.14
    assert k100.loss == (6.2383, 0.0417)
    assert k100.numbers["loss_drop"] == pytest.approx((6.2383 - 0.0417) / 6.2383)
    real = rows["host:vm"]
    assert real.versions["torch"].endswith("+cpu")
    assert real.numbers["gemm_tflops"] > 0
    assert "flash_vs_sdpa_math" not in real.numbers  # L3.flash skipped: no number, not zero


def test_failing_check_shows_with_its_reason_in_all_four_outputs(shipped_cells):
    grid = _grid(shipped_cells)
    outputs = gridlib.render_all(grid)
    reason = _row(K100).checks[FAILING_CHECK].reason
    assert reason.startswith("dq max_abs_diff 0.3125 exceeds tolerance")
    md = outputs["grid.md"]
    note = next(line for line in md.splitlines() if line.startswith("[^") and reason in line)
    number = note[2 : note.index("]")]
    k100_lines = [line for line in md.splitlines() if line.startswith(f"| {K100_CELL} / enhanced |")]
    assert sum(f"**FAIL**[^{number}]" in line for line in k100_lines) == 1
    assert f'title="{FAILING_CHECK}: fail: {reason}"' in outputs["grid.html"]
    data = json.loads(outputs["grid.json"])
    row = next(r for r in data["rows"] if r["id"] == f"{K100_CELL}/enhanced")
    assert row["result"] == "fail"
    assert row["checks"][FAILING_CHECK] == {"status": "fail", "reason": reason, "required": True}
    suite = _junit_suite(outputs["grid.xml"], f"{K100_CELL} / enhanced")
    failure = suite.find(f"testcase[@name='{FAILING_CHECK}']/failure")
    assert failure is not None and failure.get("message") == reason


def _junit_suite(text: str, name: str) -> ET.Element:
    root = ET.fromstring(text)
    suite = root.find(f"testsuite[@name='{name}']")
    assert suite is not None, name
    return suite


def test_junit_counts_and_not_run_rows_are_skipped_never_passed(shipped_cells):
    grid = _grid(shipped_cells)
    root = ET.fromstring(gridlib.render_junit(grid))
    suites = root.findall("testsuite")
    assert len(suites) == len(grid.rows)
    for suite in suites:
        cases = suite.findall("testcase")
        assert suite.get("tests") == str(len(cases))
        assert suite.get("failures") == str(len(suite.findall("testcase/failure")))
        assert suite.get("skipped") == str(len(suite.findall("testcase/skipped")))
    not_run = _junit_suite(gridlib.render_junit(grid), "rocm64-gfx942-torch280-py312 / stable")
    assert [c.get("name") for c in not_run.findall("testcase")] == ["not run"]
    assert not_run.find("testcase/skipped") is not None
    assert int(root.get("tests")) == sum(int(s.get("tests")) for s in suites)


def test_html_is_self_contained(shipped_cells):
    page = gridlib.render_html(_grid(shipped_cells))
    assert "<script" not in page
    for marker in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert marker not in page, marker
    assert page.count('<td class="notrun"') == 7 * 2  # grid span + summary cell per row


def test_same_cell_variant_from_two_hosts_gives_two_rows(shipped_cells, tmp_path):
    data = json.loads((FIXTURES / K100).read_text())
    data["host"]["hostname"] = "k100-ci-02"
    (tmp_path / "second.json").write_text(json.dumps(data))
    rows = [_row(K100), _row("second.json", tmp_path)]
    ids = [r.id for r in reports.build_grid(rows, shipped_cells).rows if r.cell == K100_CELL]
    assert ids == [f"{K100_CELL}/stable", f"{K100_CELL}/enhanced@k100-ci-01",
                   f"{K100_CELL}/enhanced@k100-ci-02"]


# --- rejecting what is not a report --------------------------------------------------


def test_a_file_that_is_not_a_report_is_rejected_with_its_name():
    result = _invoke(str(FIXTURES / CPU), str(FIXTURES / "not-a-report.json"))
    assert result.exit_code == VerificationError.return_code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "not-a-report.json: not a stackpin verification report (schema 'stackpin.grid/v1')" in lines[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ('{"schema": "stackpin.verify/v2"}', "schema 'stackpin.verify/v2'"),
        ('{"schema": "stackpin.verify/v1", "host": {}, "versions": {}}', "'checks' is missing"),
        ('{"schema": "stackpin.verify/v1", "host": {}, "versions": {}, "image": null,'
         ' "checks": [{"name": "L1.x", "level": 1, "status": "ok"}]}', "status: 'ok' is not one of"),
        ('{"schema": "stackpin.verify/v1", "host": {}, "versions": {}, "image": {"cell": "c"},'
         ' "checks": []}', "'variant' is missing"),
    ],
)
def test_invalid_reports_raise_verification_errors(text, message):
    with pytest.raises(VerificationError, match=r"^bad\.json: ") as info:
        reports.parse_report("bad.json", text)
    assert message in info.value.message
    assert "\n" not in info.value.message


# --- baseline ------------------------------------------------------------------------


def _baseline_dir(tmp_path: Path) -> Path:
    out = tmp_path / "old"
    result = _invoke(str(FIXTURES / "baseline"), "-o", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_baseline_marks_regressions_in_all_outputs_and_exits_nonzero(tmp_path):
    old = _baseline_dir(tmp_path)
    new = tmp_path / "new"
    result = _invoke(str(FIXTURES / CPU), str(FIXTURES / K100), "-o", str(new),
                     "--baseline", str(old))
    assert result.exit_code == VerificationError.return_code, result.output
    assert "2 regression(s) against" in result.stderr
    data = json.loads((new / "grid.json").read_text())
    changes = {(c["row"], c["name"]): c for c in data["changes"]}
    k100 = f"{K100_CELL}/enhanced"
    assert changes[(k100, FAILING_CHECK)]["old"] == "pass"
    assert changes[(k100, FAILING_CHECK)]["new"] == "fail"
    gemm = changes[(k100, "gemm_tflops")]  # 113.5 -> 98.1: -13.6% past 10%
    assert gemm["worse"] and gemm["old"] == "113.5" and gemm["new"] == "98.1"
    assert (k100, "flash_vs_sdpa_math") not in changes  # 23.4 -> 23.14 is within 10%
    assert not any(c["row"].startswith(CPU_CELL) for c in data["changes"])  # unchanged row
    assert data["regressions"] == 2
    md = (new / "grid.md").read_text()
    assert "**FAIL** ▼ was pass" in md
    assert "98.1 (fp16) ▼ was 113.5" in md
    assert f"- REGRESSION: {k100}: {FAILING_CHECK} pass -> fail" in md
    page = (new / "grid.html").read_text()
    assert f'class="fail worse" title="{FAILING_CHECK}: fail:' in page
    assert 'class="num worse"' in page
    suite = _junit_suite((new / "grid.xml").read_text(), f"{K100_CELL} / enhanced")
    numbers = suite.find("testcase[@name='numbers.gemm_tflops']/failure")
    assert numbers is not None and numbers.get("type") == "regression"
    check = suite.find(f"testcase[@name='{FAILING_CHECK}']/failure")
    assert check is not None and check.get("message").startswith("regression (baseline pass): ")


def test_threshold_decides_which_numbers_count(tmp_path):
    old = _baseline_dir(tmp_path)
    new = tmp_path / "new"
    result = _invoke(str(FIXTURES / CPU), str(FIXTURES / K100), "-o", str(new),
                     "--baseline", str(old), "--threshold", "0.2")
    assert result.exit_code == VerificationError.return_code  # the failing check remains
    names = {c["name"] for c in json.loads((new / "grid.json").read_text())["changes"]}
    assert names == {FAILING_CHECK}


def test_unchanged_reports_against_their_own_grid_pass(tmp_path):
    old = _baseline_dir(tmp_path)
    result = _invoke(str(FIXTURES / "baseline"), "-o", str(tmp_path / "again"),
                     "--baseline", str(old))
    assert result.exit_code == 0, result.output
    md = (tmp_path / "again" / "grid.md").read_text()
    assert "Nothing got worse; no key number moved by more than 10%." in md


def test_vanished_checks_and_rows_are_regressions(shipped_cells):
    old_grid = _grid(shipped_cells, (CPU, K100))
    baseline = comparison.parse_baseline("old/grid.json", gridlib.render_json(old_grid))
    data = json.loads((FIXTURES / K100).read_text())
    data["checks"] = [c for c in data["checks"] if c["name"] != "L6.golden"]
    row = reports.parse_report("k100.json", json.dumps(data))
    # The CPU image has no report this time: its row is not run, every check vanished.
    new = comparison.compare(reports.build_grid([row], shipped_cells), baseline,
                          source="old", threshold=0.1)
    worse = {(c.row, c.name): c for c in new.regressions}
    assert worse[(f"{K100_CELL}/enhanced", "L6.golden")].detail == "pass -> missing"
    assert (f"{CPU_CELL}/stable", "L5.lora.train") in worse
    assert worse[(f"{CPU_CELL}/stable", "gemm_tflops")].new == "missing"
    vanished = _by_id(new)[f"{K100_CELL}/enhanced"].checks["L6.golden"]
    assert (vanished.status, vanished.was) == ("missing", "pass")
    assert "L6.golden" in gridlib.render_markdown(new)


def test_improvements_are_marked_but_do_not_fail(shipped_cells):
    old = comparison.parse_baseline("old", gridlib.render_json(_grid(shipped_cells, (K100,))))
    old[f"{K100_CELL}/enhanced"]["numbers"]["flash_vs_sdpa_math"] = 10.0
    new = comparison.compare(_grid(shipped_cells, (K100,)), old, source="old", threshold=0.1)
    change = next(c for c in new.changes if c.name == "flash_vs_sdpa_math")
    assert not change.worse and change.detail.startswith("10 -> 23.14 (+131.4%")
    assert new.regressions == ()
    assert "△ was 10" in gridlib.render_markdown(new)


def test_baseline_that_is_not_a_grid_is_rejected(tmp_path):
    (tmp_path / "grid.json").write_text((FIXTURES / CPU).read_text())
    result = _invoke(str(FIXTURES / CPU), "-o", str(tmp_path / "out"), "--baseline", str(tmp_path))
    assert result.exit_code == VerificationError.return_code
    assert "grid.json: not a stackpin grid" in result.stderr


# --- evidence from real hardware, when present ---------------------------------------


def test_grid_from_docs_evidence_reports(shipped_cells):
    evidence = sorted((ROOT / "docs" / "evidence").rglob("*.json"))
    rows = []
    for path in evidence:
        text = path.read_text(encoding="utf-8")
        if '"stackpin.verify/v1"' in text:
            rows.append(reports.parse_report(str(path), text))
    if not rows:
        pytest.skip("docs/evidence/ holds no verification report yet")
    grid = reports.build_grid(rows, shipped_cells)
    outputs = gridlib.render_all(grid)
    for row in rows:
        assert row.label.split(" @ ")[0] in outputs["grid.md"]
    ET.fromstring(outputs["grid.xml"])


# --- the HTML page in a real browser -------------------------------------------------


def _chromium() -> str:
    # scripts/setup-host.sh installs Debian's chromium.
    return need_tool("chromium", "chromium-browser", "google-chrome")


def _browser(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--window-size=1400,900",
    ]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True,
                          timeout=120, check=False)


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB(A) scanlines of an 8-bit PNG (no imaging library needed)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        header = chunk if kind == b"IHDR" else header
        idat += chunk if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytes(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, up_left = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else up_left
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = bytes(line)
    return width, height, [bytes(r[i : i + 3]) for r in rows for i in range(0, stride, bpp)]


@pytest.mark.slow
def test_html_grid_renders_in_headless_chromium(shipped_cells, tmp_path):
    binary = _chromium()
    page = tmp_path / "grid.html"
    page.write_text(gridlib.render_html(_grid(shipped_cells)), encoding="utf-8")
    shot = tmp_path / "grid.png"
    done = _browser(binary, tmp_path / "profile-shot", f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), done.stderr[-2000:]
    width, height, pixels = _png_pixels(shot.read_bytes())
    assert (width, height) == (1400, 900)
    colours = set(pixels)
    white = sum(p == b"\xff\xff\xff" for p in pixels)
    assert len(colours) > 50 and white < 0.95 * len(pixels)  # not a blank page
    # The status colours of the grid are on screen: pass green, fail red, not-run grey.
    assert b"\xd4\xf4\xdd" in colours and b"\xf9\xd0\xd0" in colours
    if os.environ.get("STACKPIN_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["STACKPIN_KEEP_SCREENSHOT"])
    # The picture cannot be read by a test; the DOM the browser built can.
    dom = _browser(binary, tmp_path / "profile-dom", "--dump-dom", page.as_uri()).stdout
    assert '<table class="grid" id="grid">' in dom
    for text in (f"{K100_CELL} / enhanced", f"{CPU_CELL} / stable", "vm (bare host)",
                 "rocm64-gfx942-torch280-py312 / stable", FAILING_CHECK, "L1.gemm.bf16",
                 "L7.ddp_step", "not run: no report for this cell x variant"):
        assert text in dom, text


def test_folders_are_searched_for_reports_and_an_empty_set_is_all_not_run(tmp_path):
    (tmp_path / "artifact" / "reports-x").mkdir(parents=True)
    shutil.copy(FIXTURES / K100, tmp_path / "artifact" / "reports-x" / "report.json")
    result = _invoke(str(tmp_path / "artifact"), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "out" / "grid.json").read_text())["rows"]
    assert [r["id"] for r in rows if r["result"] != "not run"] == [f"{K100_CELL}/enhanced"]
    (tmp_path / "empty").mkdir()
    result = _invoke(str(tmp_path / "empty"), "-o", str(tmp_path / "none"))
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "none" / "grid.json").read_text())["rows"]
    assert rows and {r["result"] for r in rows} == {"not run"}


def test_a_folder_verify_wrote_is_a_grid_without_its_verified_json(tmp_path):
    # `stackpin verify` writes verified.json beside each report; the README's
    # `stackpin report grid build/reports/` must read the reports and only them.
    folder = tmp_path / "build" / "reports" / f"{K100_CELL}-enhanced"
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / K100, folder / "report.json")
    (folder / "verified.json").write_text(json.dumps({"cell": K100_CELL, "image_id": "x"}))
    result = _invoke(str(tmp_path / "build" / "reports"), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    (bad := tmp_path / "bad").mkdir()
    (bad / "other.json").write_text("{}")  # any other JSON there is still refused
    assert _invoke(str(bad), "-o", str(tmp_path / "o2")).exit_code == 6
