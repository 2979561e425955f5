"""The layout of src/stackpin: no import circle, no module over 500 lines, a complete map.

Imports are read from the source (every ``import`` anywhere in a module: at the top,
under ``if TYPE_CHECKING``, inside a function), so a circle that exists only for types
counts. The README's module map must name every module and nothing that is not one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src"
MAX_LINES = 500
# Lower-case backticked words of the map that are not module names (capitalised ones are
# types: `Engine`, `Variant`, `PlatformSpec`).
NOT_MODULES = {"docker", "src/stackpin/", "build/"}


def modules(source: Path, package: str) -> dict[str, Path]:
    found = {}
    for path in sorted((source / package).rglob("*.py")):
        name = ".".join(path.relative_to(source).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def import_graph(source: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (relative imports resolved)."""
    known = modules(source, package)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here[: len(here) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_stackpin():
    assert circles(import_graph(SOURCE, "stackpin")) == []


def test_a_circle_for_types_only_is_a_circle(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\nthing = 1\n")
    (package / "c.py").write_text("def late():\n    from . import a\n")
    assert circles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b"]]


@pytest.mark.parametrize("package", ["src/stackpin", "verify/stackpin_verify"])
def test_no_module_is_over_500_lines(package):
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in sorted((ROOT / package).rglob("*.py"))}
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


def _map_words() -> set[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("Modules in `src/stackpin/`")
    return set(re.findall(r"`([a-z_/]+)`", readme[start:readme.index("\n\n", start)]))


def _short_names() -> Iterator[tuple[str, str]]:
    for name in modules(SOURCE, "stackpin"):
        if name != "stackpin":
            yield name, name.rsplit(".", 1)[-1]


def test_the_readme_module_map_names_every_module_and_only_modules():
    words = _map_words()
    named = {short for _name, short in _short_names()}
    packages = {f"{short}/" for name, short in _short_names()
                if (SOURCE / name.replace(".", "/")).is_dir()}
    assert sorted(name for name, short in _short_names()
                  if short not in words and f"{short}/" not in words) == []
    assert sorted(words - named - packages - NOT_MODULES) == []


def test_every_module_says_what_it_is_for():
    for name, path in modules(SOURCE, "stackpin").items():
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert docstring and len(docstring.split()) >= 4, name
