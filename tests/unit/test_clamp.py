"""The step clamp (templates/clamp.py): what a BuildKit step wrote gets SOURCE_DATE_EPOCH as
its mtime (when later), and nothing the step did not touch changes, so the engine's own
layers are reproducible and a vendor base's files are never copied up."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

CLAMP = ROOT / "templates" / "clamp.py"
spec = importlib.util.spec_from_file_location("stackpin_clamp", CLAMP)
assert spec is not None and spec.loader is not None
clamp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clamp)

EPOCH = 1735689600
LATER = EPOCH + 10_000_000


def _tree(root: Path) -> None:
    (root / "opt" / "venv" / "lib").mkdir(parents=True)
    (root / "opt" / "venv" / "lib" / "mod.py").write_text("x = 1\n")
    os.symlink("lib/mod.py", root / "opt" / "venv" / "link")


def _mtimes(root: Path) -> dict[str, int]:
    found = {str(p.relative_to(root)): p.lstat().st_mtime_ns // 10**9 for p in root.rglob("*")}
    return {**found, ".": root.lstat().st_mtime_ns // 10**9}


def _run(root: Path, since_ns: int, skip: frozenset[str] = frozenset()) -> None:
    subprocess.run(clamp.find_argv(str(root), EPOCH, since_ns, set(skip)), check=True)


def test_what_the_step_wrote_is_clamped_links_folders_and_the_root_too(tmp_path: Path):
    since = time.time_ns()
    _tree(tmp_path)
    os.utime(tmp_path / "opt" / "venv" / "lib" / "mod.py", (LATER, LATER))
    _run(tmp_path, since)
    assert set(_mtimes(tmp_path).values()) == {EPOCH}
    # The symlink itself carries the epoch; its target was clamped as a file of its own.
    assert (tmp_path / "opt" / "venv" / "link").lstat().st_mtime == EPOCH


def test_older_mtimes_are_kept(tmp_path: Path):
    since = time.time_ns()
    _tree(tmp_path)
    old = tmp_path / "opt" / "venv" / "lib" / "mod.py"
    os.utime(old, (315532800, 315532800))  # a wheel's 1980 timestamp
    _run(tmp_path, since)
    assert old.stat().st_mtime == 315532800


def test_entries_the_step_did_not_touch_are_left_alone(tmp_path: Path):
    _tree(tmp_path)
    untouched = tmp_path / "opt" / "venv" / "lib" / "mod.py"
    os.utime(untouched, (LATER, LATER))  # a vendor base's file, newer than the epoch
    time.sleep(2.2)  # older than the clamp's margin, in find's whole seconds
    since = time.time_ns()
    (tmp_path / "opt" / "new.txt").write_text("written by the step\n")
    _run(tmp_path, since)
    assert untouched.stat().st_mtime == LATER
    assert (tmp_path / "opt" / "new.txt").stat().st_mtime == EPOCH
    assert (tmp_path / "opt").stat().st_mtime == EPOCH  # an entry was added to it


def test_mount_points_and_what_is_under_them_are_skipped(tmp_path: Path):
    since = time.time_ns()
    _tree(tmp_path)
    (tmp_path / "resolv.conf").write_text("nameserver 10.0.0.1\n")  # a file mount
    mounted = tmp_path / "opt" / "venv"
    _run(tmp_path, since, frozenset({str(mounted), str(tmp_path / "resolv.conf"), "/proc"}))
    assert mounted.stat().st_mtime > EPOCH
    assert (mounted / "lib" / "mod.py").stat().st_mtime > EPOCH
    assert (tmp_path / "resolv.conf").stat().st_mtime > EPOCH
    assert (tmp_path / "opt").stat().st_mtime == EPOCH


def test_mountinfo_gives_every_mount_point_but_the_root_with_escapes_decoded():
    mountinfo = (
        "22 1 0:21 / / rw - overlay overlay rw\n"
        "23 22 0:22 / /proc rw - proc proc rw\n"
        "24 22 0:23 / /tmp/wheelhouse/stack ro - overlay overlay ro\n"
        "25 22 0:24 /x /etc/resolv.conf rw - ext4 /dev/vda rw\n"
        "26 22 0:25 / /mnt/with\\040space ro - tmpfs tmpfs ro\n"
    )
    assert clamp.mount_points(mountinfo) == {
        "/proc", "/tmp/wheelhouse/stack", "/etc/resolv.conf", "/mnt/with space"}


def test_the_script_runs_as_the_dockerfile_calls_it(tmp_path: Path):
    since = time.time_ns()
    _tree(tmp_path)
    done = subprocess.run([sys.executable, str(CLAMP), str(EPOCH), str(since), str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"stackpin clamp: what this step wrote under {tmp_path} is at most {EPOCH}\n"
    assert set(_mtimes(tmp_path).values()) == {EPOCH}


def test_a_failing_walk_fails_the_step(tmp_path: Path):
    done = subprocess.run([sys.executable, str(CLAMP), str(EPOCH), "0", str(tmp_path / "gone")],
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "find exited" in done.stdout
