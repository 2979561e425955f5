"""A generated corpus of hostile matrices through every verb that reads a matrix.

Each entry is the smallest valid matrix with one value made hostile: an id that is a path,
too long or oddly spelled; a wheel "filename" that is a path or a URL; a number with
thousands of digits. Every verb must refuse it with exit 3 or 4 and one line (matrix check:
its own report lines, an ERROR line among them), and before the refusal nothing may have
happened: no process started, no connection opened, no file written, pip's seam untouched.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_matrix import MINIMAL

from stackpin.cli.main import cli
from stackpin.resolve import Pip

TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
HUGE = "9" * 5000  # past Python's 4300-digit int() limit


def _with_id(cell_id: str) -> str:
    return MINIMAL.replace("cells.c1", f"cells.{json.dumps(cell_id)}")


def _with_torch(filename: str) -> str:
    return MINIMAL.replace(f'filename = "{TORCH}"', f"filename = {json.dumps(filename)}")


def _with_line(old: str, new: str) -> str:
    assert old in MINIMAL
    return MINIMAL.replace(old, new)


def corpus() -> Iterator[tuple[str, str, str]]:
    """(name, the CELL argument verbs get, matrix text)."""
    for cell_id in ("a..b", "a/b", "../up", "/abs", "a" * 300, "a" * 65, "UPPER", "x\ny",
                    "a b", "-a", "é", "a;id", "a:b"):
        yield f"id {cell_id[:12]!r}", cell_id, _with_id(cell_id)
    for filename in (f"wheels/{TORCH}", f"/tmp/{TORCH}", f"../{TORCH}", f"..\\\\{TORCH}",
                     f"https://127.0.0.1:9/{TORCH}", f"file:///etc/{TORCH}", f"{TORCH}\n",
                     f"x {TORCH}", f".{TORCH}",
                     f"torch-2.13.0+{HUGE[:3000]}-cp311-cp311-manylinux_2_28_x86_64.whl",
                     f"torch-2.{HUGE[:300]}.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                     f"torch-2.13.0-cp311-cp311-manylinux_2_{HUGE[:3000]}_x86_64.whl"):
        yield f"filename {filename[:24]!r}", "c1", _with_torch(filename)
    numbers = [
        ('glibc = "2.36"', f"glibc = {json.dumps('2.' + HUGE[:3000])}"),
        ('glibc = "2.36"', 'glibc = "2.9999999"'),
        ('glibc = "2.36"', 'glibc = "2"'),
        ('python = "cp311"', f'python = "cp{HUGE[:200]}"'),
        ('numpy = "1.26.4"', f'numpy = "1.{HUGE[:3000]}"'),
        ('numpy = "1.26.4"', 'numpy = "1.26.4\\n--index-url http://127.0.0.1:9/"'),
        ('numpy = "<2"', f'numpy = "<{HUGE[:3000]}"'),
        ("schema_version = 1", f"schema_version = {HUGE}"),
        ("schema_version = 1", f"schema_version = 1{HUGE[:30]}"),
        ('glibc = "2.36"', f'glibc = "2.36"\nsource_date_epoch = {HUGE}'),
        ('glibc = "2.36"', f'glibc = "2.36"\nsource_date_epoch = 1{HUGE[:25]}'),
        ('glibc = "2.36"', 'glibc = "2.36"\nsource_date_epoch = -1'),
        ('glibc = "2.36"', 'glibc = "2.36"\nsource_date_epoch = 99999999999'),
        ('glibc = "2.36"', f'glibc = "2.36"\ndescription = "{"x" * 5000}"'),
    ]
    for old, new in numbers:
        yield f"number {new[:28]!r}", "c1", _with_line(old, new)


CORPUS = list(corpus())

# Every verb that reads a matrix, with the arguments that make it act on the cell ("--"
# first, so that an id such as "-a" is the cell, not an option).
VERBS: list[tuple[str, ...]] = [
    ("matrix", "list"), ("render", "--", "{id}"), ("render", "-o", "out", "--", "{id}"),
    ("lock", "--", "{id}"), ("wheels", "fetch", "--", "{id}"), ("wheels", "verify", "--", "{id}"),
    ("build", "--", "{id}"), ("build", "--prepare-only", "--", "{id}"), ("ci", "matrix"),
    ("verify", "run", "--", "{id}"), ("serve", "--", "{id}"), ("rebuild", "--check", "--", "{id}"),
    ("bundle", "export", "-o", "b", "--", "{id}"), ("report", "grid", "-o", "grid", "pinning"),
]


class Tripwires:
    """What a refused verb must not have done: each attempt is recorded, then refused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.attempts: list[str] = []

        def refuse(what: str) -> Any:
            def attempt(*args: Any, **_kwargs: Any) -> Any:
                self.attempts.append(f"{what} {args[:2]!r}")
                msg = f"tripwire: {what}"
                raise OSError(msg)
            return attempt

        monkeypatch.setattr(subprocess.Popen, "__init__", refuse("process"))
        monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
        monkeypatch.setattr(socket, "create_connection", refuse("connect"))

        def pip(**options: Any) -> Pip:
            return Pip(**options,
                       runner=lambda argv, _sink: self.attempts.append(f"pip {argv[3:5]}") or 1)

        for module in ("matrix_cmd", "lock_cmd", "wheels_cmd"):
            monkeypatch.setattr(f"stackpin.cli.{module}.Pip", pip)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


@pytest.fixture
def hostile_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    project = tmp_path / "project"
    (project / "pinning").mkdir(parents=True)
    monkeypatch.chdir(project)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return project


def _invoke(args: list[str]) -> tuple[int, list[str]]:
    done = CliRunner().invoke(cli, args)
    assert "Traceback" not in done.output
    return done.exit_code, done.output.strip().splitlines()


@pytest.mark.parametrize(("name", "cell_id", "text"), CORPUS, ids=[c[0] for c in CORPUS])
def test_every_matrix_verb_refuses_the_entry_in_one_line_having_done_nothing(
        hostile_project, monkeypatch, name, cell_id, text):
    (hostile_project / "pinning" / "m.toml").write_text(text, encoding="utf-8")
    before = snapshot(hostile_project)
    wires = Tripwires(monkeypatch)
    for verb in VERBS:
        args = [part.replace("{id}", cell_id) for part in verb]
        code, lines = _invoke(args)
        assert code in (3, 4), (name, verb, code, lines)
        assert len(lines) == 1, (name, verb, lines)
        assert lines[0].startswith(("stackpin: configuration error: ",
                                    "stackpin: validation error: ")), (name, verb, lines)
    code, lines = _invoke(["matrix", "check"])
    assert code in (3, 4), (name, lines)
    # A file that is no matrix at all is its one line; else the report names the problem.
    assert len(lines) == 1 or any(line.startswith("ERROR ") for line in lines), (name, lines)
    assert lines[-1].startswith("stackpin: "), (name, lines)
    assert all(line.startswith(("ERROR ", "WARN  ", "checked ", "stackpin: ")) for line in lines)
    assert wires.attempts == [], name
    assert snapshot(hostile_project) == before, name


def test_the_corpus_is_refused_for_its_hostile_value_not_by_accident(hostile_project):
    # The unmutated matrix passes every rule: each entry is refused for its one change.
    (hostile_project / "pinning" / "m.toml").write_text(MINIMAL, encoding="utf-8")
    code, lines = _invoke(["matrix", "check", "--no-resolve"])
    assert code == 0, lines
    assert _invoke(["matrix", "list"])[0] == 0
    assert len(CORPUS) >= 35


# --- the seam: what reaches pip ----------------------------------------------------------


def _recording_pip(calls: list[list[str]]) -> Pip:
    return Pip(runner=lambda argv, _sink: calls.append(argv) or 1)


@pytest.mark.parametrize("text", [_with_torch(f"https://127.0.0.1:9/{TORCH}"),
                                  _with_id("a" * 300), _with_line('glibc = "2.36"',
                                                                  'glibc = "2.9999999"')])
def test_resolve_cell_refuses_a_malformed_cell_before_pip(text):
    import tomllib

    from stackpin.errors import ConfigurationError
    from stackpin.matrixfile import decode_matrix_lenient
    from stackpin.resolve import resolve_cell

    # matrix check decodes leniently: the cell exists although its file has a problem.
    matrix, problems = decode_matrix_lenient(tomllib.loads(text))
    assert matrix is not None and problems
    (cell,) = matrix.cells.values()
    calls: list[list[str]] = []
    with pytest.raises(ConfigurationError, match="nothing was resolved"):
        resolve_cell(cell, _recording_pip(calls), use_cache=False)
    assert calls == []


@pytest.mark.parametrize("verb", [("lock", "c1"), ("wheels", "fetch", "c1")])
def test_a_cell_that_violates_a_rule_is_never_resolved_or_locked(hostile_project, monkeypatch,
                                                                verb):
    # A torch wheel for CPython 3.10 in a cp311 cell: well-formed, but a violation.
    wrong = TORCH.replace("cp311-cp311", "cp310-cp310")
    (hostile_project / "pinning" / "m.toml").write_text(_with_torch(wrong), encoding="utf-8")
    wires = Tripwires(monkeypatch)
    code, lines = _invoke(list(verb))
    assert code == 4, lines
    (line,) = lines
    assert "torch.filename" in line and "nothing was done" in line
    assert wires.attempts == []
    assert not (hostile_project / "pinning" / "locks").exists()


@pytest.mark.parametrize(("key", "value"), [
    ("filename", "../../../etc/passwd.whl"), ("filename", "/etc/x.whl"),
    ("version", "1.0\n--index-url http://127.0.0.1:9/"), ("name", "numpy ; rm"),
    ("sha256", "z" * 64), ("group", "everything"), ("version", HUGE[:300]),
])
def test_a_hostile_lock_is_refused_before_the_wheelhouse_is_read(hostile_project, monkeypatch,
                                                                 key, value):
    import tomllib

    from stackpin.lock import cell_digest
    from stackpin.matrixfile import decode_matrix

    pinned = _with_line('source = "index"', f'source = "index"\nsha256 = "{"cd" * 32}"')
    (hostile_project / "pinning" / "m.toml").write_text(pinned, encoding="utf-8")
    cell = decode_matrix(tomllib.loads(pinned), source="m.toml").cells["c1"]
    wheel = {"name": "numpy", "version": "1.26.4", "filename":
             "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl", "sha256": "ab" * 32,
             "group": "stack", "source": "index", "origin": "https://files.example/x"}
    lock = {"lock_version": 2, "cell": "c1", "cell_digest": cell_digest(cell),
            "python": "cp311", "source_date_epoch": 0, "base": {"reference": "", "digest": ""},
            "missing": [], "resolution": {"resolver": "pip", "key": ""}, "excluded": {},
            "dropped": [], "wheels": [{**wheel, key: value}]}
    locks = hostile_project / "pinning" / "locks"
    locks.mkdir()
    (locks / "c1.lock").write_text(json.dumps(lock), encoding="utf-8")
    before = snapshot(hostile_project)
    wires = Tripwires(monkeypatch)
    for verb in (["wheels", "verify", "c1"], ["wheels", "fetch", "c1"],
                 ["build", "--prepare-only", "c1"], ["render", "c1"], ["ci", "matrix"]):
        code, lines = _invoke(verb)
        assert code == 3, (verb, lines)
        (line,) = lines
        assert "c1.lock" in line and "re-create it with 'stackpin lock'" in line, line
    assert wires.attempts == []
    assert snapshot(hostile_project) == before
    lock["wheels"] = [wheel]  # the same lock with the value as stackpin writes it
    (locks / "c1.lock").write_text(json.dumps(lock), encoding="utf-8")
    assert _invoke(["wheels", "verify", "c1"])[0] == 4  # read: the wheel is just not there


def test_matrix_check_resolves_the_good_cell_beside_a_bad_one_and_only_it(hostile_project,
                                                                          monkeypatch):
    bad = _with_torch(f"https://127.0.0.1:9/{TORCH}").replace("cells.c1", "cells.bad")
    text = MINIMAL + bad.split("schema_version = 1", 1)[1]
    (hostile_project / "pinning" / "m.toml").write_text(text, encoding="utf-8")
    seen: list[str] = []

    def record(argv: list[str], _sink: Any) -> int:
        requirements = Path(argv[argv.index("-r") + 1]).read_text(encoding="utf-8")
        seen.append(requirements)
        return 1  # pip fails: a host error for the good cell, after the bad one was skipped

    monkeypatch.setattr("stackpin.cli.matrix_cmd.Pip", lambda: Pip(runner=record))
    code, lines = _invoke(["matrix", "check"])
    assert code == 8, lines  # the good cell reached pip (whose failure is the host's)
    # "bad" sorts first, so it would have been the one pip saw had it not been skipped.
    assert len(seen) == 1 and "torch==2.13.0+cpu" in seen[0].splitlines()
    assert "127" not in seen[0]
    # A problem outside every cell puts the whole file in doubt: nothing is resolved.
    seen.clear()
    (hostile_project / "pinning" / "m.toml").write_text(
        text.replace("schema_version = 1", "schema_version = 2"), encoding="utf-8")
    code, lines = _invoke(["matrix", "check"])
    assert code == 3, lines
    assert seen == []
