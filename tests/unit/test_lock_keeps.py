"""`stackpin lock` over an existing lock changes what was changed (stackpin.lock.resolve_keeping).

Re-locking after one pin edit used to resolve every unpinned distribution afresh: on
2026-12-02 a peft bump moved httpx and sse-starlette too, because the index had released
them since, and so the image's lower layers and a site's delta (issue 25). The previous
lock's versions now go to pip as constraints; where the new pins need other versions, the
closure is resolved afresh and the lock says so. The pip runs are the recorded reports of
tests/unit/test_resolve.py, replayed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.unit.test_resolve import CELLS, Replay

from stackpin.lock import Lock, changed_pins, lock_from_resolution, resolve_keeping
from stackpin.resolve import Pip, resolve_cell

CELL = CELLS["dropped-transitive"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKPIN_CACHE_DIR", str(tmp_path / "cache"))


class Constrained(Replay):
    """The replay, and what each pip run was constrained to; optionally a resolver failure
    for every run that carries constraints (new pins that need other versions)."""

    def __init__(self, cell: str, *, refuse_constrained: bool = False) -> None:
        super().__init__(cell)
        self.constraints: list[str] = []
        self.refuse = refuse_constrained

    def __call__(self, argv: list[str], on_line: Callable[[str], None]) -> int:
        lines = Path(argv[argv.index("-r") + 1]).read_text().splitlines()
        held = [Path(line[3:]).read_text() for line in lines if line.startswith("-c ")]
        self.constraints += held
        if held and self.refuse:
            self.calls.append(argv)
            on_line("ERROR: Cannot install x because these package versions have "
                    "conflicting dependencies.")
            return 1
        return super().__call__(argv, on_line)


def _first_lock() -> Lock:
    result = resolve_cell(CELL, Pip(runner=Replay("dropped-transitive")), use_cache=False)
    return lock_from_resolution(CELL, result, base_reference="x")


def _older(lock: Lock, name: str, version: str) -> Lock:
    wheels = tuple(dataclasses.replace(w, version=version) if w.name == name else w
                   for w in lock.wheels)
    return dataclasses.replace(lock, wheels=wheels)


def test_the_previous_locks_unpinned_versions_are_held_and_the_pins_are_not():
    previous = _older(_first_lock(), "h11", "0.14.0")
    runner = Constrained("dropped-transitive")
    resolution, held = resolve_keeping(CELL, Pip(runner=runner), previous, use_cache=False)
    assert held and resolution.ok
    assert runner.constraints, "the closure run carries the previous versions"
    lines = set(runner.constraints[-1].splitlines())
    assert "h11==0.14.0" in lines
    pinned = {name for name in CELL.stack} | {"torch"}
    assert not any(line.split("==")[0] in pinned for line in lines), lines
    assert not any(line.startswith("torch==") for line in lines), "a vendor pin is the cell's"


def test_pins_that_need_other_versions_resolve_afresh_and_say_so():
    previous = _older(_first_lock(), "h11", "0.0.1")
    runner = Constrained("dropped-transitive", refuse_constrained=True)
    resolution, held = resolve_keeping(CELL, Pip(runner=runner), previous, use_cache=False)
    assert not held and resolution.ok
    assert runner.constraints, "the held run was tried first"
    assert not any(line.startswith("-c ") for line in runner.requirements[-1]), \
        "the fresh run holds nothing"


def test_no_previous_lock_resolves_afresh():
    runner = Constrained("dropped-transitive")
    resolution, held = resolve_keeping(CELL, Pip(runner=runner), None, use_cache=False)
    assert not held and resolution.ok and runner.constraints == []


def test_held_and_fresh_results_are_cached_apart():
    previous = _older(_first_lock(), "h11", "0.14.0")  # the fresh result is cached now
    held = Replay("dropped-transitive")
    resolve_keeping(CELL, Pip(runner=held), previous)
    assert held.calls, "a held resolution never reads the fresh one's cache"
    again = Replay("dropped-transitive")
    resolve_keeping(CELL, Pip(runner=again), previous)
    assert again.calls == [], "and is cached under its own key"


def test_changed_pins_lists_each_move_by_name():
    old = _first_lock()
    new = _older(old, "h11", "9.9.9")
    new = dataclasses.replace(new, wheels=tuple(w for w in new.wheels if w.name != "click"))
    lines = changed_pins(old, new)
    h11 = next(w.version for w in old.wheels if w.name == "h11")
    assert lines == [f"h11 {h11} -> 9.9.9",
                     f"click {next(w.version for w in old.wheels if w.name == 'click')} (gone)"]
    assert changed_pins(old, old) == []
    assert all(line.endswith("(new)") for line in changed_pins(None, old))
