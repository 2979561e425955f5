"""The daemon-free tier's slow tests start on different xdist workers (tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.conftest import spread_slow_tests


@dataclass
class Item:
    name: str
    marks: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def _items() -> list[Item]:
    fast = [Item(f"fast{n}") for n in range(10)]
    slow = [Item(f"slow{n}", {"slow"}) for n in range(3)]
    docker = [Item(f"docker{n}", {"docker"}) for n in range(2)]
    return [*slow, *fast, *docker]  # the slow ones side by side, as collected


def test_each_worker_share_starts_with_its_slow_tests_and_nothing_is_lost():
    items = _items()
    before = {item.name for item in items}
    spread_slow_tests(items, 2)  # type: ignore[arg-type]
    names = [item.name for item in items]
    assert set(names) == before and len(names) == len(before)
    assert names[-2:] == ["docker0", "docker1"]  # the Docker tier stays last
    first, second = names[:7], names[7:13]  # worksteal's two contiguous shares of 13
    assert first[:2] == ["slow0", "slow2"] and second[0] == "slow1"


def test_one_worker_keeps_the_collection_order():
    items = _items()
    spread_slow_tests(items, 1)  # type: ignore[arg-type]
    assert [item.name for item in items] == [item.name for item in _items()]
