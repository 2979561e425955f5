"""Issue 20's device kit (scripts/gpu/PLAN-issue20.md), as far as a host with no GPU can
run it: the staging of the lock's parts, one device call each, and the replay setup's
refusal of parts that are missing or differ. A part that arrives corrupted, or a machine
that went cold between calls (an earlier part gone), must stop the sequence with exit 8
and one line saying what to do, never go on to a replay of half a lock.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "scripts" / "gpu"


def _run(script: str, *args: str, cwd: Path, parts: Path,
         replay: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "LOCKPARTS": str(parts),
           "REPLAY_DIR": str(replay or parts.parent / "replay")}
    return subprocess.run(["bash", str(GPU / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)


@pytest.fixture
def staged(tmp_path: Path) -> Path:
    """A checkout whose .whl/lock holds three parts and their parts.sha256."""
    lock = tmp_path / "repo" / ".whl" / "lock"
    lock.mkdir(parents=True)
    lines = []
    for n, data in enumerate((b"first part", b"second part", b"third")):
        (lock / f"part-0{n}").write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  part-0{n}\n")
    (lock / "parts.sha256").write_text("".join(lines))
    return tmp_path / "repo"


def test_each_call_keeps_its_part_and_says_how_many_the_machine_holds(staged, tmp_path):
    parts = tmp_path / "lockparts"
    for n, held in (("00", 1), ("01", 2), ("02", 3)):
        done = _run("stage-part.sh", n, cwd=staged, parts=parts)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"holds {held} of 3 parts" in done.stdout
    assert "every part is here" in done.stdout
    assert (parts / "part-01").read_bytes() == b"second part"


def test_a_machine_that_went_cold_between_calls_stops_the_sequence(staged, tmp_path):
    parts = tmp_path / "lockparts"
    assert _run("stage-part.sh", "00", cwd=staged, parts=parts).returncode == 0
    (parts / "part-00").unlink()  # a fresh machine: what the first call left is gone
    done = _run("stage-part.sh", "01", cwd=staged, parts=parts)
    assert done.returncode == 8
    assert "part-00 from an earlier call is gone" in done.stdout
    assert "Start again at part 00" in done.stdout


def test_a_part_that_differs_from_its_sum_is_refused(staged, tmp_path):
    (staged / ".whl" / "lock" / "part-01").write_bytes(b"second parT")
    done = _run("stage-part.sh", "01", cwd=staged, parts=tmp_path / "lockparts")
    assert done.returncode == 8
    assert "part-01 differs from parts.sha256" in done.stdout


@pytest.mark.parametrize("args", [(), ("1",), ("01; rm -rf /",), ("../00",)])
def test_a_part_number_that_is_not_two_digits_is_a_usage_error(staged, tmp_path, args):
    done = _run("stage-part.sh", *args, cwd=staged, parts=tmp_path / "lockparts")
    assert done.returncode != 0
    assert not (tmp_path / "lockparts").exists()


def test_a_part_not_carried_names_the_carry_list(staged, tmp_path):
    (staged / ".whl" / "lock" / "part-02").unlink()
    done = _run("stage-part.sh", "02", cwd=staged, parts=tmp_path / "lockparts")
    assert done.returncode == 2
    assert '.whl/lock/part-02", ".whl/lock/parts.sha256"' in done.stdout


def test_the_replay_setup_refuses_a_missing_part_before_anything_is_installed(staged,
                                                                              tmp_path):
    parts = tmp_path / "lockparts"
    for n in ("00", "01"):
        assert _run("stage-part.sh", n, cwd=staged, parts=parts).returncode == 0
    done = _run("replay-setup.sh", cwd=staged, parts=parts)
    assert done.returncode == 8
    assert "a part is missing or differs" in done.stdout
    assert not (tmp_path / "replay" / "venv").exists()


def test_the_replay_setup_refuses_a_carried_wheel_whose_hash_is_not_the_record(tmp_path):
    """The parts join into wheels/ + replay.json; one carried file that differs from the
    sha256 replay.json names stops the setup before the venv is made."""
    src = tmp_path / "src" / "wheels"
    src.mkdir(parents=True)
    (src / "a-1.0-py3-none-any.whl").write_bytes(b"not the recorded bytes")
    (src / "replay.json").write_text(json.dumps({"entries": [
        {"replay_file": "a-1.0-py3-none-any.whl", "replay_sha256": "0" * 64}]}))
    repo = tmp_path / "repo"
    (repo / ".whl" / "lock").mkdir(parents=True)
    subprocess.run(["tar", "-cf", str(repo / ".whl" / "lock" / "part-00"), "-C",
                    str(src.parent), "wheels"], check=True)
    data = (repo / ".whl" / "lock" / "part-00").read_bytes()
    (repo / ".whl" / "lock" / "parts.sha256").write_text(
        f"{hashlib.sha256(data).hexdigest()}  part-00\n")
    parts = tmp_path / "lockparts"
    assert _run("stage-part.sh", "00", cwd=repo, parts=parts).returncode == 0
    done = _run("replay-setup.sh", cwd=repo, parts=parts)
    assert done.returncode == 8, done.stdout + done.stderr
    assert "sha256 mismatches: 1 ['a-1.0-py3-none-any.whl']" in done.stdout
    assert not (tmp_path / "replay" / "venv").exists()


def _stage_lock():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("stage_lock", GPU / "stage-lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("total", "count"), [
    (523_479_040, 10),  # the CUDA lock's carried files (2026-12-02): ten calls, not eleven
    (55 * 2**20, 1), (55 * 2**20 + 1, 2), (1, 1),
])
def test_parts_are_the_fewest_under_the_cap_and_cut_evenly(total, count):
    size = _stage_lock().part_size(total, 55)
    parts = -(-total // size)
    assert parts == count
    assert size <= 55 * 2**20
    # Even: no part is a crumb (the last holds at least all but `count` bytes of a share).
    assert total - (parts - 1) * size >= size - parts
