"""The tool rule itself: a missing tool skips locally and fails under CI=true."""

from __future__ import annotations

import pytest
from tests import tools

ABSENT = "stackpin-no-such-tool-h13"


def test_missing_tool_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=ABSENT):
        tools.need_tool(ABSENT)


@pytest.mark.parametrize("value", ["true", "TRUE"])
def test_missing_tool_fails_under_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match=f"CI=true but {ABSENT} is not installed"):
        tools.need_tool(ABSENT)


def test_missing_module_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="stackpin_no_such_module"):
        tools.need_module("stackpin_no_such_module")


def test_present_tool_is_found_first_match_wins(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert tools.need_tool(ABSENT, "sh").endswith("/sh")
    assert tools.need_module("json").dumps([]) == "[]"
