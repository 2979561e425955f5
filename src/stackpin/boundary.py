"""The vendor boundary of a cell: what the vendor provides, what is excluded, what is dropped.

Pure: cells and resolver metadata in, violations and conflict lines out. The resolver
itself (pip, side effects) lives in ``resolve``; this module only judges its inputs and
outputs, so every rule is testable on recorded data.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackpin.matrix import Cell, DroppedRequirement, PinnedWheel, Provided


@dataclass(frozen=True)
class Conflict:
    """One reason a cell cannot be locked, printed as one line."""

    cell: str
    message: str

    def __str__(self) -> str:
        return f"{self.cell}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class DistMeta:
    """What the resolver reported about one distribution."""

    name: str  # canonical
    version: str
    requires: tuple[str, ...] = ()


def canon(name: str) -> str:
    return str(canonicalize_name(name))


def marker_environment(cell: Cell) -> dict[str, str]:
    """PEP 508 marker values of the cell's target (not of the host running stackpin)."""
    digits = cell.python.removeprefix("cp")
    version = f"{digits[0]}.{digits[1:]}"
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{version}.0",
        "os_name": "posix",
        "platform_machine": cell.cpu_arch,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": f"{version}.0",
        "python_version": version,
        "sys_platform": "linux",
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def applicable(requires: tuple[str, ...], env: Mapping[str, str]) -> list[Requirement]:
    """The requirements whose markers hold on the target, without extras."""
    out = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or _marker_holds(req.marker, env):
            out.append(req)
    return out


def _marker_holds(marker: Marker, env: Mapping[str, str]) -> bool:
    return bool(marker.evaluate(dict(env)))


def vendor_pins(cell: Cell) -> dict[str, PinnedWheel]:
    """Vendor-source pinned wheels the cell installs, by canonical distribution name."""
    wheels = [cell.torch, *cell.vendor_wheels]
    if cell.attention is not None:
        wheels.append(cell.attention)
    return {canon(_dist_of(w.filename)): w for w in wheels if w.source == "vendor"}


def _parses(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)  # PEP 440 compares local labels case-insensitively
    except InvalidVersion:
        return a == b


def _dist_of(filename: str) -> str:
    return filename.split("-", 1)[0]


def _version_of(filename: str) -> str:
    parts = filename.split("-")
    return parts[1] if len(parts) > 1 else ""


def effective_provided(cell: Cell) -> dict[str, Provided]:
    """Declared provided distributions, plus every pinned vendor wheel not declared (at its
    label, no requirements): a vendor file is never resolved from an index either way."""
    out = {canon(name): p for name, p in cell.provided.items()}
    for name, wheel in vendor_pins(cell).items():
        out.setdefault(name, Provided(id=name, version=_version_of(wheel.filename)))
    return dict(sorted(out.items()))


def provided_versions(cell: Cell) -> dict[str, str]:
    return {name: p.version for name, p in effective_provided(cell).items()}


def dropped_edges(cell: Cell) -> set[tuple[str, str]]:
    return {(canon(d.of), canon(d.requirement)) for d in cell.dropped}


def excluded(cell: Cell) -> dict[str, str]:
    return {canon(name): reason for name, reason in cell.excluded.items()}


Problem = tuple[str, str, str, str, str]  # field, expected, found, how to fix, severity


def declaration_problems(cell: Cell) -> Iterator[Problem]:
    """Boundary declarations that contradict the rest of the cell."""
    vendor = vendor_pins(cell)
    provided = {canon(n): p for n, p in cell.provided.items()}
    for name, wheel in sorted(vendor.items()):
        entry = provided.get(name)
        label = _version_of(wheel.filename)
        if entry is None:
            yield ("provided", f"{name} declared as provided (a vendor wheel of it is pinned)",
                   "not declared", f'add provided.{name} = {{ version = "{label}", requires = '
                   f"[...] }} for {wheel.filename}: without its requirements the lock may lack "
                   "what it imports", "warning")
        elif _parses(label) and not _same_version(entry.version, label):
            # (an unparsable file name is the filename rule's to report)
            yield (f"provided.{name}.version", f"{label} (the vendor wheel's label)",
                   entry.version, f"{wheel.filename} decides: pin one version in both places",
                   "error")
    for name, entry in sorted(provided.items()):
        yield from _provided_entry_problems(cell, name, entry, vendor)
    stack = {canon(n) for n in cell.stack}
    for name in sorted(excluded(cell)):
        if name in stack or name in provided:
            where = "stack" if name in stack else "provided"
            yield (f"excluded.{name}", f"{name} nowhere else", f"{name} in {where}",
                   f"an excluded distribution is never installed: remove it from {where}", "error")
    for drop in cell.dropped:
        if not drop.reason.strip():
            yield ("dropped", "a reason", "empty",
                   f"say why {drop.of} runs without {drop.requirement}", "error")


def _provided_entry_problems(
    cell: Cell, name: str, entry: Provided, vendor: Mapping[str, PinnedWheel]
) -> Iterator[Problem]:
    try:
        Version(entry.version)
    except InvalidVersion:
        yield (f"provided.{name}.version", "a PEP 440 version", repr(entry.version),
               "copy the version (with its label) from the vendor file's name", "error")
    if entry.by == "vendor-wheel" and name not in vendor:
        yield (f"provided.{name}.by", f"a pinned vendor wheel of {name}", "none",
               'pin its file (torch, attention or vendor_wheels) or set by = "base-image"',
               "error")
    if entry.by == "base-image" and name in {canon(n) for n in cell.stack}:
        # (a vendor wheel's name in the stack is the stack-overlap rule's)
        yield (f"provided.{name}", "provided or in the stack", "both",
               "a provided distribution never comes from the index: remove it from the stack",
               "error")
    for text in entry.requires:
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            yield (f"provided.{name}.requires", "PEP 508 requirements", repr(text), str(exc),
                   "error")
    if entry.placeholder:
        yield (f"provided.{name}.version", "a label seen on a real vendor file",
               f"{entry.version} (placeholder)", "re-pin from the name of the file you receive",
               "warning")


def pins(cell: Cell, index_pins: Mapping[str, str]) -> dict[str, str]:
    """Every exact version the cell decides: stack, provided, index-source pinned wheels."""
    out = {canon(n): v for n, v in cell.stack.items()}
    out.update(index_pins)
    out.update(provided_versions(cell))
    return out


def pin_conflicts(
    cell: Cell, metadata: Mapping[str, DistMeta], index_pins: Mapping[str, str]
) -> list[Conflict]:
    """Direct requirements of each pinned distribution against the cell's other decisions.

    This is not a resolver: it only compares one requirement with one pin, so the
    message can name both; pip resolves the rest.
    """
    env = marker_environment(cell)
    decided = pins(cell, index_pins)
    cut = dropped_edges(cell)
    gone = excluded(cell)
    found: list[Conflict] = []
    for name in sorted(metadata):
        meta = metadata[name]
        for req in applicable(meta.requires, env):
            dep = canon(req.name)
            if (name, dep) in cut:
                continue
            if dep in gone:
                found.append(Conflict(cell.id, _excluded_line(cell, [meta], dep)))
            elif dep in decided and not req.specifier.contains(decided[dep], prereleases=True):
                found.append(Conflict(cell.id, f"{meta.name} {meta.version} requires "
                                      f"{dep}{req.specifier}; the cell pins {decided[dep]}"))
    for drop in cell.dropped:
        if canon(drop.of) in metadata and not _requires(metadata[canon(drop.of)], drop, env):
            found.append(Conflict(cell.id, f"dropped {drop.of} -> {drop.requirement}: "
                                  f"{drop.of} does not require it; remove the entry"))
    return found


def _requires(meta: DistMeta, drop: DroppedRequirement, env: Mapping[str, str]) -> bool:
    wanted = canon(drop.requirement)
    return any(canon(r.name) == wanted for r in applicable(meta.requires, env))


def _excluded_line(cell: Cell, chain: list[DistMeta], dep: str) -> str:
    path = " → ".join(f"{m.name} {m.version}" for m in chain)
    reason = excluded(cell)[dep]
    return f"{path} → {dep}: excluded on {cell.platform} ({reason})"


def closure_conflicts(
    cell: Cell, closure: Mapping[str, DistMeta], roots: list[str]
) -> list[Conflict]:
    """Excluded distributions that a resolution still pulled in, each with its chain."""
    gone = excluded(cell)
    env = marker_environment(cell)
    cut = dropped_edges(cell)
    found = []
    for name in sorted(set(closure) & set(gone)):
        chain = _chain(closure, roots, name, env, cut)
        found.append(Conflict(cell.id, _excluded_line(cell, chain, name)))
    return found


def _chain(
    closure: Mapping[str, DistMeta],
    roots: list[str],
    target: str,
    env: Mapping[str, str],
    cut: set[tuple[str, str]],
) -> list[DistMeta]:
    """Shortest path of requirers from a requested root to ``target`` (breadth first)."""
    parents: dict[str, str | None] = {r: None for r in roots if r in closure}
    queue = deque(parents)
    while queue:
        name = queue.popleft()
        for req in applicable(closure[name].requires, env):
            dep = canon(req.name)
            if dep in parents or dep not in closure or (name, dep) in cut:
                continue
            parents[dep] = name
            if dep == target:
                return _walk_back(closure, parents, name)
            queue.append(dep)
    return []


def _walk_back(
    closure: Mapping[str, DistMeta], parents: Mapping[str, str | None], last: str
) -> list[DistMeta]:
    chain = []
    node: str | None = last
    while node is not None:
        chain.append(closure[node])
        node = parents[node]
    return list(reversed(chain))


def reachable(
    graph: Mapping[str, DistMeta],
    roots: list[str],
    env: Mapping[str, str],
    cut: set[tuple[str, str]],
    *,
    root_extras: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, set[str]]:
    """Names reachable from the roots through requirements that hold on the target, each
    with the extras some requirer asked of it (``fastapi[standard]``); ``root_extras`` are
    those the cell itself asks of a root (``flash-attn-4[cu13]``)."""
    asked = root_extras or {}
    extras: dict[str, set[str]] = {r: set(asked.get(r, ())) for r in roots if r in graph}
    queue = deque(extras)
    while queue:
        name = queue.popleft()
        for req in applicable_with_extras(graph[name].requires, env, extras[name]):
            dep = canon(req.name)
            if dep not in graph or (name, dep) in cut:
                continue
            new = dep not in extras or not set(req.extras) <= extras[dep]
            extras.setdefault(dep, set()).update(req.extras)
            if new:
                queue.append(dep)
    return extras


def applicable_with_extras(
    requires: tuple[str, ...], env: Mapping[str, str], extras: set[str]
) -> list[Requirement]:
    """Requirements that hold on the target for the base package or any requested extra."""
    out: dict[str, Requirement] = {}
    for extra in sorted({"", *extras}):
        for req in applicable(requires, {**env, "extra": extra}):
            out.setdefault(str(req), req)
    return list(out.values())


GUIDE = """\
## The vendor boundary: `provided`, `excluded`, `dropped`

A DTK cell mixes two worlds: the vendor's ABI-bound builds (torch, triton, FlashAttention,
vLLM, dropped by hand into `wheels/vendor/`) and everything else from the public index.
Three settings draw the line, and `matrix check`, `stackpin lock`, the build guard and
verify L0 all enforce it:

- `provided.<dist>`: the vendor supplies this distribution at exactly this version, local
  label included. While resolving, a metadata-only placeholder wheel (this name, this
  version, its `requires`, no files) is handed to pip as a direct URL requirement, so pip
  treats the vendor torch as installed and never fetches an index torch. Its version must
  equal the label of the pinned vendor file (`2.9.0+das.opt1.dtk2604` for
  `torch-2.9.0+das.opt1.dtk2604-cp310-...whl`); the guard and L0 fail an image whose
  installed version differs (an index build replaced the vendor's).
- `excluded.<dist> = "reason"`: never installed in this cell. If a resolution pulls it in,
  `matrix check` names the chain and repeats the reason, e.g.
  `unsloth 2026.10.9 → bitsandbytes: excluded on dtk (no native build: ...)`.
- `dropped`: one requirement of one distribution that the cell runs without, with the
  reason (the field's `pip install --no-deps`). The requirer enters the resolution as a
  placeholder with that requirement removed; the lock records the real index file for it
  and the dropped edge.

### Worked example

```toml
[cells.dtk2604-k100-torch290-py310.torch]
filename = "torch-2.9.0+das.opt1.dtk2604-cp310-cp310-manylinux_2_28_x86_64.whl"

[cells.dtk2604-k100-torch290-py310.provided.torch]
version = "2.9.0+das.opt1.dtk2604"
requires = ["filelock", "typing-extensions>=4.10.0", "sympy>=1.13.3", "networkx>=2.5.1",
            "jinja2", "fsspec>=0.8.5"]

[cells.dtk2604-k100-torch290-py310.excluded]
bitsandbytes = "no native build: a generic wheel claims ROCm support, then fails"

[[cells.dtk2604-k100-torch290-py310.dropped]]
of = "unsloth"
requirement = "bitsandbytes"
reason = "4/8-bit loading is disabled on DTK; BF16/LoRA need none"

[cells.dtk2604-k100-torch290-py310.stack]
transformers = "5.5.0"
unsloth = "2026.10.9"
```

`stackpin lock dtk2604-k100-torch290-py310` resolves this with pip: torch is the
placeholder (the lock says `"source": "vendor"`, origin `vendor file wheels/vendor/torch-...`),
filelock and sympy come from the index with their sha256 and URL, unsloth is the real index
file although pip saw it without bitsandbytes. Remove the `dropped` entry and the check says
`unsloth 2026.10.9 → bitsandbytes: excluded on dtk (...)`; pin `transformers = "4.57.4"`
and it says `unsloth 2026.10.9 requires transformers!=4.53.0,...,!=4.57.4,...,<=5.17.0,
>=4.52.4; the cell pins 4.57.4`. Both exit 4. `stackpin wheels fetch` then downloads every
index file and lists the vendor files `wheels/vendor/` must hold; `matrix check` prints the
`sha256sum wheels/vendor/<file>` command that pins each one.
"""
