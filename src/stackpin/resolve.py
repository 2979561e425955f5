"""Resolve a cell's closure with pip's own resolver, respecting the vendor boundary.

Why pip and rewritten placeholder metadata rather than uv's ``override-dependencies``:
pip is the installer the image uses and its ``--dry-run --report`` JSON is a documented,
versioned format (the seam the tests replay); an override in uv is global (it rewrites
the requirement for every dependent), while the field practice this models is per edge
(``pip install unsloth --no-deps``, then the rest by hand), and the lock must say which
edge was cut. So a distribution with dropped requirements, like a provided one, enters
the resolution as a metadata-only wheel given as a direct URL requirement: pip accepts it
as the only candidate for that name and reads its (rewritten) requirements; the lock
then records the real index file for it. Nothing here decides versions: pip does.

Passes: (1) ``--no-deps`` report of every pin, for the pins' own metadata and the direct
conflicts (one line each, naming both sides); (2) the full resolution with placeholders,
repeated while it pulls in a distribution whose requirements the cell drops; (3) the
closure is checked for excluded distributions, each reported with its chain.

Known limit, shown rather than hidden: pip evaluates environment markers with the
interpreter running it, so stackpin re-evaluates the closure's markers for the cell's
CPython and reports a requirement that the target needs but the resolution left out.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlparse

from packaging.requirements import InvalidRequirement, Requirement

from stackpin import boundary
from stackpin.boundary import Conflict, DistMeta, canon
from stackpin.cache import cache_dir
from stackpin.errors import ConfigurationError, HostEnvironmentError, ValidationError
from stackpin.matrix import Cell, Provided
from stackpin.matrixfile import cell_problems_of
from stackpin.piptarget import LineSink, Runner, report_argv, report_sha256, subprocess_runner

# Bump when the resolution logic changes what a cached result means.
RESOLVER_VERSION = 1
Origin = Literal["index", "vendor-wheel", "base-image"]
_PLACEHOLDER_TAG = "py3-none-any"
_MAX_ROUNDS = 6


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """One distribution of the closure and where it comes from."""

    name: str
    version: str
    origin: Origin
    filename: str = ""
    url: str = ""
    sha256: str = ""
    requires: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "origin": self.origin,
                "filename": self.filename, "url": self.url, "sha256": self.sha256,
                "requires": list(self.requires)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Resolved:
        return cls(name=data["name"], version=data["version"], origin=data["origin"],
                   filename=data["filename"], url=data["url"], sha256=data["sha256"],
                   requires=tuple(data["requires"]))


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """The outcome for one cell: a closure, or the conflicts that prevent one."""

    cell: str
    key: str
    closure: tuple[Resolved, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    cached: bool = False

    @property
    def ok(self) -> bool:
        return not self.conflicts

    def to_json(self) -> dict[str, Any]:
        return {"resolver_version": RESOLVER_VERSION, "cell": self.cell, "key": self.key,
                "closure": [r.to_json() for r in self.closure]}


@dataclass(frozen=True, kw_only=True)
class Pip:
    """How pip is run: the command seam tests replace with recorded reports."""

    runner: Runner = subprocess_runner
    python: str = sys.executable
    on_line: LineSink = field(default=lambda _line: None)
    keep_reports: Path | None = None  # copy each pip report here (recording test data)


def resolution_key(cell: Cell) -> str:
    """Digest of everything that decides the closure (not hashes, env or run flags)."""
    inputs = {
        "resolver": RESOLVER_VERSION, "python": cell.python, "glibc": cell.glibc,
        "cpu_arch": cell.cpu_arch, "stack": dict(sorted(cell.stack.items())),
        "index_pins": index_pins(cell),
        "provided": {n: [p.version, p.by, list(p.requires)] for n, p in
                     boundary.effective_provided(cell).items()},
        "excluded": sorted(cell.excluded), "dropped": sorted(
            (d.of, d.requirement) for d in cell.dropped),
    }
    extras = index_extras(cell)
    if extras:  # absent when none, so cells without extras keep their keys
        inputs["extras"] = {n: list(e) for n, e in sorted(extras.items())}
    if constraints := closure_constraints(cell):  # a rehearsal cell's (stackpin.rehearsal)
        inputs["constraints"] = constraints
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def index_pins(cell: Cell) -> dict[str, str]:
    """Index-source pinned wheels (torch on CPU/CUDA) by canonical name and version."""
    wheels = [cell.torch, *cell.vendor_wheels]
    if cell.attention is not None and cell.locks_attention:
        wheels.append(cell.attention)
    out = {}
    for wheel in wheels:
        if wheel.source == "index":
            parts = wheel.filename.split("-")
            out[canon(parts[0])] = parts[1]
    return out


def _pinned(cell: Cell) -> dict[str, str]:
    """What the resolution starts from: the stack pins and the index-source wheels."""
    return {canon(n): v for n, v in cell.stack.items()} | index_pins(cell)


def closure_constraints(cell: Cell) -> dict[str, str]:
    """Versions the closure must take where it has the distribution at all: a rehearsal
    cell's real lock (pip constraints, never requirements), less what the cell pins."""
    if cell.rehearsal is None:
        return {}
    pinned = _pinned(cell)
    return {canon(n): v for n, v in sorted(cell.rehearsal.constraints.items())
            if canon(n) not in pinned}


def index_extras(cell: Cell) -> dict[str, tuple[str, ...]]:
    """Extras asked of index-source pinned wheels (flash-attn-4[cu13]), by canonical name."""
    wheels = [cell.torch, *cell.vendor_wheels]
    if cell.attention is not None and cell.locks_attention:
        wheels.append(cell.attention)
    return {canon(w.filename.split("-")[0]): tuple(sorted(w.extras))
            for w in wheels if w.source == "index" and w.extras}


def attention_only(cell: Cell, closure: tuple[Resolved, ...]) -> set[str]:
    """The attention wheel and what only it pulls in (flash-attn-4's CuTe DSL, say): that is
    the enhanced variant's layer, and the stable image never carries it."""
    if cell.attention is None or not cell.locks_attention:
        return set()
    attention = canon(cell.attention.filename.split("-")[0])
    graph = {r.name: DistMeta(name=r.name, version=r.version, requires=r.requires)
             for r in closure if r.name != attention}
    roots = [n for n in _roots(cell, _pinned(cell)) if n != attention]
    stable = boundary.reachable(graph, roots, boundary.marker_environment(cell),
                                boundary.dropped_edges(cell), root_extras=index_extras(cell))
    return {r.name for r in closure} - set(stable)


def resolve_cell(cell: Cell, pip: Pip, *, use_cache: bool = True,
                 keep: Mapping[str, str] | None = None) -> Resolution:
    """The cell's closure from the cache, else from pip (conflicts are never cached).
    ``keep``: versions held (pip constraints) where the closure has the distribution and the
    cell does not pin it (the previous lock's: stackpin.lock.resolve_keeping); the lock
    records the cell's key, the cache key tells kept versions apart too.

    A cell with a problem in its values (a path or URL for a file name, an id that is not
    a file name, an unbounded version) is refused here, before its pins reach pip: this is
    the last gate before the network, whichever verb comes through it.
    """
    if problems := cell_problems_of(cell):
        msg = (f"{cell.id}: {problems[0]}; nothing was resolved: 'stackpin matrix check' "
               "lists every problem")
        raise ConfigurationError(msg)
    key = resolution_key(cell)
    held = {canon(n): v for n, v in sorted((keep or {}).items()) if canon(n) not in _pinned(cell)}
    constraints = held | closure_constraints(cell)
    cache_key = key if not held else hashlib.sha256(
        f"{key} {json.dumps(held, sort_keys=True)}".encode()).hexdigest()
    cached = _read_cache(cache_key, key) if use_cache else None
    if cached is not None:
        return Resolution(cell=cell.id, key=key, closure=cached, cached=True)
    with tempfile.TemporaryDirectory(prefix="stackpin-resolve-") as tmp:
        result = _resolve(cell, pip, key, Path(tmp), constraints)
    if result.ok:
        _write_cache(cache_key, result)
    return result


def _resolve(cell: Cell, pip: Pip, key: str, work: Path,
             constraints: Mapping[str, str]) -> Resolution:
    pinned = _pinned(cell)
    metadata = {m.name: m for m in _report_items(
        _run_report(cell, pip, work, "pins", [f"{n}=={v}" for n, v in sorted(pinned.items())],
                    deps=False))}
    conflicts = boundary.pin_conflicts(cell, metadata, index_pins(cell))
    if conflicts:
        return Resolution(cell=cell.id, key=key, conflicts=tuple(conflicts))
    rewritten = {n: metadata[n] for n in _droppers(cell) if n in metadata}
    for_target: set[str] = set()
    for _round in range(_MAX_ROUNDS):
        requirements = (_requirements(cell, pinned, rewritten, work, constraints)
                        + sorted(for_target))
        report = _run_report(cell, pip, work, f"closure{_round}", requirements, deps=True)
        items = {i.name: i for i in _report_items(report)}
        new = {n: items[n] for n in _droppers(cell) if n in items and n not in rewritten}
        graph = _graph(cell, items, rewritten)
        missing = {str(r) for _n, r in _missing_for_target(cell, graph, _roots(cell, pinned))}
        if not new and missing <= for_target:
            return _finish(cell, key, items, rewritten, pinned)
        rewritten.update(new)
        for_target |= missing
    msg = (f"{cell.id}: the resolution did not settle in {_MAX_ROUNDS} rounds "
           "(dropped requirements or target markers kept adding distributions)")
    raise HostEnvironmentError(msg)


def _droppers(cell: Cell) -> list[str]:
    """Resolved distributions whose requirements the cell drops (a provided one's
    placeholder already leaves them out)."""
    return sorted({canon(d.of) for d in cell.dropped} - set(boundary.effective_provided(cell)))


@dataclass(frozen=True, kw_only=True)
class _Item(DistMeta):
    url: str = ""
    sha256: str = ""


def _report_items(report: Mapping[str, Any]) -> list[_Item]:
    """pip's installation report (format version 1) to plain items."""
    items = []
    for entry in report.get("install", []):
        meta = entry["metadata"]
        info = entry.get("download_info", {})
        items.append(_Item(name=canon(meta["name"]), version=meta["version"],
                           requires=tuple(meta.get("requires_dist", ())),
                           url=info.get("url", ""), sha256=report_sha256(info)))
    return items


def _requirements(cell: Cell, pinned: Mapping[str, str], rewritten: Mapping[str, _Item],
                  work: Path, constraints: Mapping[str, str]) -> list[str]:
    cut = boundary.dropped_edges(cell)
    lines = []
    for name, entry in boundary.effective_provided(cell).items():
        kept = tuple(r for r in entry.requires if (name, _req_name(r)) not in cut)
        wheel = placeholder_wheel(work / "placeholders", name, entry.version, kept)
        lines.append(f"{name} @ {wheel.as_uri()}")
    for name, meta in sorted(rewritten.items()):
        kept = tuple(r for r in meta.requires if (name, _req_name(r)) not in cut)
        wheel = placeholder_wheel(work / "rewritten", name, meta.version, kept)
        lines.append(f"{name} @ {wheel.as_uri()}")
    extras = index_extras(cell)
    lines += [f"{n}{_extras_text(extras.get(n, ()))}=={v}"
              for n, v in sorted(pinned.items()) if n not in rewritten]
    # pip cannot constrain a requirement given as a file (the rewritten placeholders).
    if held := {n: v for n, v in sorted(constraints.items()) if n not in rewritten}:
        path = work / "constraints.txt"
        path.write_text("".join(f"{n}=={v}\n" for n, v in held.items()), encoding="utf-8")
        lines.append(f"-c {path}")
    return lines


def _extras_text(extras: tuple[str, ...]) -> str:
    return f"[{','.join(extras)}]" if extras else ""


def _req_name(text: str) -> str:
    try:
        return canon(Requirement(text).name)
    except InvalidRequirement:
        return ""


def placeholder_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...]) -> Path:
    """A metadata-only wheel: name, version (with its local label), requirements, no files."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    dist_info = f"{stem}-{version}.dist-info"
    metadata = "".join(
        ["Metadata-Version: 2.1\n", f"Name: {name}\n", f"Version: {version}\n",
         "Summary: stackpin placeholder: provided outside the index\n"]
        + [f"Requires-Dist: {r}\n" for r in requires]
    )
    wheel_meta = (f"Wheel-Version: 1.0\nGenerator: stackpin\nRoot-Is-Purelib: true\n"
                  f"Tag: {_PLACEHOLDER_TAG}\n")
    files = {f"{dist_info}/METADATA": metadata, f"{dist_info}/WHEEL": wheel_meta}
    record = "".join(f"{p},sha256={_urlsafe_digest(t)},{len(t.encode())}\n"
                     for p, t in files.items()) + f"{dist_info}/RECORD,,\n"
    path = folder / f"{stem}-{version}-{_PLACEHOLDER_TAG}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in [*files.items(), (f"{dist_info}/RECORD", record)]:
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(info, text)
    return path


def _urlsafe_digest(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _run_report(cell: Cell, pip: Pip, work: Path, step: str, requirements: list[str],
                *, deps: bool) -> dict[str, Any]:
    req_file = work / f"{step}.txt"
    req_file.write_text("\n".join(requirements) + "\n", encoding="utf-8")
    report = work / f"{step}.json"
    lines: list[str] = []

    def keep(line: str) -> None:
        lines.append(line)
        pip.on_line(line)

    argv = report_argv(cell, pip.python, report, work / "target", req_file, deps=deps)
    if pip.runner(argv, keep) != 0:
        raise _pip_failure(cell, lines)
    text = report.read_text(encoding="utf-8")
    if pip.keep_reports is not None:
        pip.keep_reports.mkdir(parents=True, exist_ok=True)
        (pip.keep_reports / report.name).write_text(text, encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


class ResolutionFailed(ValidationError):
    """pip found no closure for the cell's pins; ``conflict`` is the one line that says why."""

    def __init__(self, conflict: Conflict, details: list[str]) -> None:
        super().__init__(str(conflict), details=details)
        self.conflict = conflict


def _pip_failure(cell: Cell, lines: list[str]) -> HostEnvironmentError | ValidationError:
    caused = _cause_lines(lines)
    if caused:
        return ResolutionFailed(Conflict(cell.id, "pip: " + "; ".join(caused)), lines)
    errors = [ln.removeprefix("ERROR: ").strip() for ln in lines if ln.startswith("ERROR:")]
    if any("satisfies the requirement" in e or "conflicting dependencies" in e for e in errors):
        return ResolutionFailed(Conflict(cell.id, "pip: " + errors[0]), lines)
    msg = (f"{cell.id}: pip could not resolve ({errors[0] if errors else 'no output'}); "
           "check the network to the index, or resolve once online (results are cached)")
    return HostEnvironmentError(msg, details=lines)


def _cause_lines(lines: list[str]) -> list[str]:
    """The 'conflict is caused by' block of pip's ResolutionImpossible message."""
    out: list[str] = []
    inside = False
    for line in lines:
        if "The conflict is caused by:" in line:
            inside = True
            continue
        if inside:
            if not line.strip():
                if out:
                    break
                continue
            out.append(line.strip())
    return out


def _roots(cell: Cell, pinned: Mapping[str, str]) -> list[str]:
    return sorted(set(pinned) | set(boundary.effective_provided(cell)))


def _graph(cell: Cell, items: Mapping[str, _Item],
           rewritten: Mapping[str, _Item]) -> dict[str, DistMeta]:
    """Requirement graph of a report; rewritten stand-ins keep only their kept edges."""
    graph = {n: DistMeta(name=n, version=i.version, requires=i.requires)
             for n, i in items.items()}
    for name, meta in rewritten.items():
        graph[name] = DistMeta(name=name, version=meta.version, requires=_kept(cell, name, meta))
    return graph


def _finish(cell: Cell, key: str, items: Mapping[str, _Item],
            rewritten: Mapping[str, _Item], pinned: Mapping[str, str]) -> Resolution:
    provided = boundary.effective_provided(cell)
    graph = _graph(cell, items, rewritten)
    roots = _roots(cell, pinned)
    conflicts = boundary.closure_conflicts(cell, graph, roots)
    conflicts += [Conflict(cell.id, f"{n} {graph[n].version} requires {r} on {cell.python}, "
                           "but pip left it out; pin it in the stack")
                  for n, r in _missing_for_target(cell, graph, roots)]
    if conflicts:
        return Resolution(cell=cell.id, key=key, conflicts=tuple(conflicts))
    # pip judged markers by its own interpreter: what only that interpreter needs goes.
    wanted = boundary.reachable(graph, roots, boundary.marker_environment(cell),
                                boundary.dropped_edges(cell), root_extras=index_extras(cell))
    closure = tuple(_with_real_file(_resolved(n, items[n], provided.get(n)), rewritten.get(n))
                    for n in sorted(items) if n in wanted)
    return Resolution(cell=cell.id, key=key, closure=closure)


def _kept(cell: Cell, name: str, meta: DistMeta) -> tuple[str, ...]:
    cut = boundary.dropped_edges(cell)
    return tuple(r for r in meta.requires if (name, _req_name(r)) not in cut)


def _resolved(name: str, item: _Item, provided: Provided | None) -> Resolved:
    if provided is not None:
        return Resolved(name=name, version=provided.version, origin=provided.by,
                        requires=provided.requires)
    return Resolved(name=name, version=item.version, origin="index",
                    filename=_filename(item.url), url=item.url, sha256=item.sha256,
                    requires=item.requires)


def _with_real_file(entry: Resolved, real: _Item | None) -> Resolved:
    if real is None:
        return entry
    return Resolved(name=entry.name, version=real.version, origin="index",
                    filename=_filename(real.url), url=real.url, sha256=real.sha256,
                    requires=real.requires)


def _filename(url: str) -> str:
    return unquote(Path(urlparse(url).path).name)


def _missing_for_target(
    cell: Cell, graph: Mapping[str, DistMeta], roots: list[str]
) -> list[tuple[str, str]]:
    """(requirer, requirement without marker) the target CPython needs but the resolution
    left out: pip evaluates markers with the interpreter running it, not the target's."""
    env = boundary.marker_environment(cell)
    cut = boundary.dropped_edges(cell)
    extras = boundary.reachable(graph, roots, env, cut, root_extras=index_extras(cell))
    found = []
    for name in sorted(extras):
        for req in boundary.applicable_with_extras(graph[name].requires, env, extras[name]):
            dep = canon(req.name)
            if dep not in graph and (name, dep) not in cut:
                bare = Requirement(str(req))
                bare.marker = None
                found.append((name, str(bare)))
    return found


def _cache_file(key: str) -> Path:
    return cache_dir() / "resolve" / f"{key}.json"


def _read_cache(file_key: str, key: str) -> tuple[Resolved, ...] | None:
    path = _cache_file(file_key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("resolver_version") != RESOLVER_VERSION or data.get("key") != key:
            return None
        return tuple(Resolved.from_json(r) for r in data["closure"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: resolve again


def _write_cache(key: str, result: Resolution) -> None:
    path = _cache_file(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_json(), sort_keys=True), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the next run a resolution
