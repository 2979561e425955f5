"""The top-level handler: whatever goes wrong, one line and a documented exit code;
a traceback only with --debug."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from stackpin.bundle import verify as verifying
from stackpin.cli.main import cli


@pytest.mark.parametrize(("error", "code", "line"), [
    (RuntimeError("boom\nsecond line"), 1, "stackpin: internal error: RuntimeError: boom\\nsecond"),
    (RecursionError("deep"), 1, "this is a bug, please report it"),
    (MemoryError(), 1, "internal error: MemoryError"),
    (PermissionError(13, "Permission denied", "/x"), 8, "environment error: Permission denied /x"),
])
def test_unexpected_errors_are_one_line_with_a_documented_code(monkeypatch, tmp_path, error,
                                                                code, line):
    def explode(*_args, **_kwargs):
        raise error

    monkeypatch.setattr(verifying, "verify", explode)
    args = ["bundle", "verify", str(tmp_path), "--insecure-unsigned"]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == code
    lines = done.output.strip().splitlines()
    assert len(lines) == 1, done.output
    assert line in lines[0]
    assert "Traceback" not in done.output
    debug = CliRunner().invoke(cli, ["--debug", *args])
    assert debug.exception is error  # --debug lets it through, with its traceback


@pytest.mark.parametrize("exists", [False, True])
def test_names_with_control_characters_are_escaped_in_errors(tmp_path, exists):
    hostile = tmp_path / "x\nstackpin: bundle OK\x1b[2J"
    if exists:  # an empty folder: refused by the bundle check (7), not by the argument (2)
        hostile.mkdir()
    done = CliRunner().invoke(cli, ["bundle", "verify", str(hostile), "--insecure-unsigned"])
    assert done.exit_code == (7 if exists else 2)
    assert len(done.output.strip().splitlines()) == 1
    assert "\\nstackpin: bundle OK\\x1b[2J" in done.output
