"""The resolver seam: what stackpin makes of pip's own reports (recorded from real runs).

The runner replays the reports that tests/fixtures/resolver/record.py recorded against the
index, so each test shows stackpin's judgement of what pip really said, offline.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import pytest

from stackpin.boundary import Conflict
from stackpin.errors import HostEnvironmentError, ValidationError
from stackpin.lock import lock_from_resolution
from stackpin.matrix import Cell
from stackpin.matrixfile import load_matrix
from stackpin.resolve import (
    Pip,
    ResolutionFailed,
    placeholder_wheel,
    resolution_key,
    resolve_cell,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "resolver"
CELLS = load_matrix(FIXTURES / "cells.toml").cells


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKPIN_CACHE_DIR", str(tmp_path / "cache"))


class Replay:
    """A pip runner that answers each report with the recorded one of the same step."""

    def __init__(self, cell: str) -> None:
        self.folder = FIXTURES / cell
        self.calls: list[list[str]] = []
        self.requirements: list[list[str]] = []

    def __call__(self, argv: list[str], on_line: Callable[[str], None]) -> int:
        self.calls.append(argv)
        report = Path(argv[argv.index("--report") + 1])
        req_file = Path(argv[argv.index("-r") + 1])
        self.requirements.append(req_file.read_text().splitlines())
        recorded = self.folder / report.name
        if not recorded.exists():
            on_line(f"ERROR: no recorded report {recorded.name}")
            return 1
        shutil.copyfile(recorded, report)
        return 0


def resolve(cell_id: str, cell: Cell | None = None) -> tuple[object, Replay]:
    replay = Replay(cell_id)
    return resolve_cell(cell or CELLS[cell_id], Pip(runner=replay)), replay


def test_pin_outside_a_dependencys_range_names_both_sides():
    result, replay = resolve("pin-outside-range")
    lines = [c.message for c in result.conflicts]
    assert "unsloth 2025.10.12 requires transformers" in lines[0] and "4.57.6" in lines[0]
    assert any(line.startswith("unsloth 2025.10.12 requires trl") and "0.23.1" in line
               for line in lines)
    assert len(replay.calls) == 1, "a direct conflict stops before the full resolution"
    assert "--no-deps" in replay.calls[0]


def test_the_first_pass_targets_the_cell_not_the_host():
    _result, replay = resolve("pin-outside-range")
    argv = replay.calls[0]
    assert argv[argv.index("--python-version") + 1] == "3.10"
    assert "cp310" in argv and "manylinux_2_35_x86_64" in argv
    assert "--dry-run" in argv and "--only-binary=:all:" in argv


def test_excluded_distribution_pulled_in_transitively_names_the_chain():
    result, _replay = resolve("excluded-transitive")
    assert not result.ok
    line = str(result.conflicts[0])
    assert line.startswith("excluded-transitive: accelerate 1.10.1 → ")
    assert "→ huggingface-hub " in line and "→ httpx2 " in line
    assert line.endswith("→ idna: excluded on dtk (test: never installed here)")


def test_provided_distribution_enters_as_a_placeholder_by_direct_url():
    _result, replay = resolve("excluded-transitive")
    closure_reqs = replay.requirements[1]
    torch = [r for r in closure_reqs if r.startswith("torch @ file://")]
    assert len(torch) == 1
    assert unquote(torch[0]).endswith("/torch-2.9.0+das.opt1.dtk2604-py3-none-any.whl")
    assert "torch==" not in " ".join(closure_reqs), "pip must never be asked for index torch"


def test_dropped_requirement_rewrites_the_requirer_and_locks_the_real_file():
    result, replay = resolve("dropped-transitive")
    assert result.ok, result.conflicts
    names = {r.name: r for r in result.closure}
    assert "idna" not in names
    httpx2 = names["httpx2"]
    assert httpx2.origin == "index" and httpx2.url.startswith("https://")
    assert httpx2.sha256 and httpx2.filename.startswith("httpx2-")
    assert any(r.startswith("httpx2 @ file://") for r in replay.requirements[-1])
    torch = names["torch"]
    assert torch.origin == "vendor-wheel" and torch.version == "2.9.0+das.opt1.dtk2604"


def test_lock_records_provenance_and_the_vendor_file_to_pin():
    cell = CELLS["dropped-transitive"]
    result, _ = resolve("dropped-transitive")
    lock = lock_from_resolution(cell, result, base_reference=cell.base.image)
    data = json.loads(lock.text())
    by_name = {w["name"]: w for w in data["wheels"]}
    assert by_name["torch"]["source"] == "vendor"
    assert by_name["torch"]["origin"] == f"vendor file wheels/vendor/{cell.torch.filename}"
    assert by_name["accelerate"]["origin"].startswith("https://")
    assert data["missing"] == [cell.torch.filename], "an unpinned vendor file keeps it incomplete"
    assert data["dropped"] == [
        {"of": "httpx2", "requirement": "idna", "reason": "test: the cell runs without it"},
        {"of": "anyio", "requirement": "idna", "reason": "test: the cell runs without it"}]
    assert data["excluded"] == {"idna": "test: never installed here"}


class Pip230Replay(Replay):
    """The same reports as pip 23.0 (Debian 12's venv) writes them for find-links files:
    the legacy ``archive_info.hash`` alone, no ``hashes``."""

    def __call__(self, argv: list[str], on_line: Callable[[str], None]) -> int:
        code = super().__call__(argv, on_line)
        report = Path(argv[argv.index("--report") + 1])
        data = json.loads(report.read_text())
        for entry in data.get("install", []):
            archive = entry.get("download_info", {}).get("archive_info", {})
            if "hashes" in archive:
                archive["hash"] = f"sha256={archive.pop('hashes')['sha256']}"
        report.write_text(json.dumps(data))
        return code


def test_pip_230s_single_hash_field_gives_the_same_lock_hashes():
    cell = CELLS["dropped-transitive"]
    current, _ = resolve("dropped-transitive")
    legacy = resolve_cell(cell, Pip(runner=Pip230Replay("dropped-transitive")), use_cache=False)
    hashes = {w.name: w.sha256 for w in lock_from_resolution(
        cell, current, base_reference="x").wheels}
    assert any(hashes.values())
    assert {w.name: w.sha256 for w in lock_from_resolution(
        cell, legacy, base_reference="x").wheels} == hashes


def test_a_conflicted_resolution_cannot_become_a_lock():
    cell = CELLS["excluded-transitive"]
    result, _ = resolve("excluded-transitive")
    with pytest.raises(ValidationError, match="idna: excluded on dtk"):
        lock_from_resolution(cell, result, base_reference="x")


def test_clean_results_are_cached_by_the_resolution_inputs():
    first, _replay = resolve("dropped-transitive")
    again, replay2 = resolve("dropped-transitive")
    assert again.cached and again.closure == first.closure
    assert replay2.calls == [], "a cached cell resolves offline"


def test_conflicts_are_not_cached():
    resolve("excluded-transitive")
    again, replay = resolve("excluded-transitive")
    assert not again.cached and replay.calls


def test_resolution_key_ignores_hashes_but_not_pins():
    import dataclasses

    cell = CELLS["dropped-transitive"]
    pinned = dataclasses.replace(cell, torch=dataclasses.replace(cell.torch, sha256="a" * 64))
    moved = dataclasses.replace(cell, stack={"accelerate": "1.10.0"})
    assert resolution_key(pinned) == resolution_key(cell)
    assert resolution_key(moved) != resolution_key(cell)


def test_pip_resolution_impossible_becomes_one_conflict_line():
    cell = CELLS["excluded-transitive"]
    lines = [
        "ERROR: Cannot install a==1 and b==2 because these package versions have conflicting "
        "dependencies.", "", "The conflict is caused by:", "    The user requested c==3",
        "    a 1 depends on c<3", "", "To fix this you could try to:",
    ]

    def runner(argv: list[str], on_line: Callable[[str], None]) -> int:
        if "--no-deps" in argv:
            shutil.copyfile(FIXTURES / "excluded-transitive" / "pins.json",
                            Path(argv[argv.index("--report") + 1]))
            return 0
        for line in lines:
            on_line(line)
        return 1

    with pytest.raises(ResolutionFailed) as failed:
        resolve_cell(cell, Pip(runner=runner))
    assert failed.value.conflict == Conflict(
        cell.id, "pip: The user requested c==3; a 1 depends on c<3")


def test_unreachable_index_is_a_host_error_not_a_conflict():
    def runner(argv: list[str], on_line: Callable[[str], None]) -> int:
        on_line("ERROR: Could not install packages due to an OSError: connection refused")
        return 1

    with pytest.raises(HostEnvironmentError, match="check the network") as failed:
        resolve_cell(CELLS["excluded-transitive"], Pip(runner=runner))
    assert not isinstance(failed.value, ResolutionFailed)


def test_placeholder_wheel_is_metadata_only(tmp_path: Path):
    path = placeholder_wheel(tmp_path, "flash-attn", "2.8.3+das.opt1.dtk2604.torch290",
                             ("torch", "einops"))
    assert path.name == "flash_attn-2.8.3+das.opt1.dtk2604.torch290-py3-none-any.whl"
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        meta = archive.read("flash_attn-2.8.3+das.opt1.dtk2604.torch290.dist-info/METADATA")
    assert all(".dist-info/" in n for n in names), "no files besides metadata"
    assert b"Version: 2.8.3+das.opt1.dtk2604.torch290" in meta
    assert b"Requires-Dist: einops" in meta
