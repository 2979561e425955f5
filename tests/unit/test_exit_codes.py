"""Every exit code the README documents has an input that produces it, through the CLI.

The table is read from the README itself, so a code added there without an input here (or
the other way round) fails. Each error is one line on the way out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner
from test_matrix import MINIMAL
from tests.conftest import pin_fake_installer
from tests.fake_engine import FakeEngine

from stackpin.cli import common
from stackpin.cli.main import cli
from stackpin.lock import lock_from_resolution
from stackpin.matrixfile import decode_matrix
from stackpin.resolve import Pip, Resolution, Resolved, resolution_key

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
NUMPY = "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl"


def documented_codes() -> dict[int, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = re.search(r"Exit codes: ([0-9a-z ,]+)\.", text.replace("\n", " "))
    assert table is not None
    found = re.findall(r"(\d+) ([a-z ]+?)(?:,|$)", table.group(1))
    return {int(code): name.strip() for code, name in found}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def locked_project(root: Path) -> None:
    """A one-cell project with a current lock and a wheelhouse that matches it, so that a
    build passes every check and reaches the engine."""
    for folder in ("templates", "verify"):
        shutil.copytree(ROOT / folder, root / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    text = MINIMAL.replace(
        '[cells.c1.base.bootstrap]\nsuite = "bookworm"\nmirror = "http://deb.debian.org/debian"\n',
        '[cells.c1.base]\nimage = "debian:bookworm"\n',
    ).replace('source = "index"', f'source = "index"\nsha256 = "{_sha(b"torch")}"')
    (root / "pinning" / "locks").mkdir(parents=True)
    (root / "pinning" / "m.toml").write_text(text, encoding="utf-8")
    cell = decode_matrix(tomllib.loads(text), source="m.toml").cells["c1"]
    closure = (
        Resolved(name="numpy", version="1.26.4", origin="index", filename=NUMPY,
                 url=f"https://files.example/{NUMPY}", sha256=_sha(b"numpy")),
        Resolved(name="torch", version="2.13.0+cpu", origin="index", filename=TORCH,
                 url=f"https://files.example/{TORCH}", sha256=_sha(b"torch")),
    )
    lock = lock_from_resolution(
        cell, Resolution(cell="c1", key=resolution_key(cell), closure=closure),
        base_reference="debian:bookworm")
    (root / "pinning" / "locks" / "c1.lock").write_text(lock.text(), encoding="utf-8")
    (root / "wheels" / "c1").mkdir(parents=True)
    (root / "wheels" / "c1" / TORCH).write_bytes(b"torch")
    (root / "wheels" / "c1" / NUMPY).write_bytes(b"numpy")
    pin_fake_installer(root)


def _build_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    locked_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    engine = FakeEngine(fail_builds=True)  # the daemon's build fails at a step
    monkeypatch.setattr(common.ENGINE, "factory", lambda: contextlib.nullcontext(engine))
    return ["build", "c1", "--no-normalize", "--builder", "classic"]


def _interrupted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    # Ctrl-C while pip resolves (the resolver seam raises what the signal raises).
    (tmp_path / "m.toml").write_text(MINIMAL, encoding="utf-8")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def interrupt(_argv: list[str], _sink: Callable[[str], None]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr("stackpin.cli.matrix_cmd.Pip", lambda: Pip(runner=interrupt))
    return ["matrix", "check", str(tmp_path / "m.toml")]


def _unreadable_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    (tmp_path / "a.json").write_text('{"schema": "not a report"}', encoding="utf-8")
    return ["verify", "diff", str(tmp_path / "a.json"), str(tmp_path / "a.json")]


def _empty_bundle(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    (tmp_path / "bundle").mkdir()
    return ["bundle", "verify", str(tmp_path / "bundle"), "--insecure-unsigned"]


def _no_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    return ["images"]


def _in_root(args: list[str]) -> Callable[[pytest.MonkeyPatch, Path], list[str]]:
    def setup(monkeypatch: pytest.MonkeyPatch, _tmp_path: Path) -> list[str]:
        monkeypatch.chdir(ROOT)
        return args
    return setup


# code -> (how to produce it, words its one line holds)
TABLE: dict[int, tuple[Callable[[pytest.MonkeyPatch, Path], list[str]], str]] = {
    0: (_in_root(["matrix", "list"]), "cpu-bookworm-torch2130-py311"),
    2: (_in_root(["bundle", "verify", "no/such/bundle", "--pubkey", "no.pub"]), "usage error"),
    3: (_in_root(["render", "no-such-cell"]), "configuration error: no cell 'no-such-cell'"),
    4: (_in_root(["wheel", "inspect", f"torch-2.{'9' * 5000}.0-cp311-cp311-linux_x86_64.whl"]),
        "validation error"),
    5: (_build_fails, "build error: build failed at Step 3/9"),
    6: (_unreadable_report, "verification error"),
    7: (_empty_bundle, "bundle error"),
    8: (_no_daemon, "environment error"),
    130: (_interrupted, "interrupted"),
}


def test_the_table_covers_every_documented_code():
    assert set(TABLE) == set(documented_codes())
    assert documented_codes()[2] == "usage"


@pytest.mark.parametrize("code", sorted(TABLE))
def test_each_documented_code_has_an_input_that_produces_it(monkeypatch, tmp_path, code):
    setup, word = TABLE[code]
    args = setup(monkeypatch, tmp_path)
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == code, (args[:3], done.output)
    assert word in done.output
    assert "Traceback" not in done.output
    if code:
        lines = [line for line in done.output.strip().splitlines()
                 if not line.startswith(("builder:", "base:", "Step "))]
        assert len(lines) == 1, done.output
        assert lines[0].startswith("stackpin: ")


def test_a_wheel_name_past_every_bound_is_one_validation_line_not_an_internal_error():
    for name in (f"torch-2.13.0+{'1' * 5000}-cp311-cp311-linux_x86_64.whl",
                 f"torch-2.13.0-cp311-cp311-manylinux_2_{'9' * 5000}_x86_64.whl",
                 f"torch-{'9' * 5000}-cp311-cp311-linux_x86_64.whl"):
        done = CliRunner().invoke(cli, ["wheel", "inspect", name])
        assert done.exit_code == 4, done.output
        (line,) = done.output.strip().splitlines()
        assert "no file system holds a name of more than 255" in line
    done = CliRunner().invoke(cli, ["wheel", "inspect", "--json", TORCH])
    assert json.loads(done.output)["torch"] == "2.13.0"  # a real name still parses
