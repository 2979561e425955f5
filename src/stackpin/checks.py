"""Cross-checks of a matrix cell: do its pins fit together before anything is built?

Pure: a Cell in, a list of Violations out. Every rule runs on every cell and every
violation is returned, so a release engineer fixes a matrix in one pass. The rules
encode ../shared/dcu-facts.md (issue 2, item 5); each says why where it is not obvious.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackpin.abi import (
    WheelInfo,
    cpython_version,
    parse_base_reference,
    parse_wheel_filename,
    platform_fits,
    python_tag_fits,
)
from stackpin.boundary import declaration_problems
from stackpin.errors import ValidationError
from stackpin.matrix import Cell, PinnedWheel, Variant, pinned_wheels
from stackpin.untrusted import shown

Severity = Literal["error", "warning"]

# torch releases before 2.3 were built against numpy 1 only (numpy 2 support came in 2.3).
_NUMPY2_TORCH = Version("2.3")
# The smallest version that counts as numpy 2: its first development release.
_NUMPY2_FIRST = Version("2.dev0")
_BNB_ENV = "UNSLOTH_DISABLE_BITSANDBYTES"
_LLD_ENV = "TRITON_HIP_LLD_PATH"
_PLATFORM_NAMES = {"dtk": "DTK", "rocm": "ROCm", "cuda": "CUDA", "cpu": "CPU"}


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One broken rule of one cell, printed as one line."""

    cell: str
    field: str
    expected: str
    found: str
    fix: str
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"{self.cell}: {self.field}"
        line = f"{where}: expected {self.expected}, found {self.found}; {self.fix}"
        return shown(line, limit=2000)  # a matrix value cannot break the line

    def to_json(self) -> dict[str, str]:
        return {
            "cell": self.cell,
            "field": self.field,
            "expected": self.expected,
            "found": self.found,
            "fix": self.fix,
            "severity": self.severity,
        }


@dataclass(frozen=True, kw_only=True)
class _Wheel:
    """A pinned wheel with its matrix path and, when its filename parses, what it says."""

    path: str
    pin: PinnedWheel
    info: WheelInfo | None


@dataclass(frozen=True, kw_only=True)
class _Context:
    cell: Cell
    wheels: tuple[_Wheel, ...]
    torch: WheelInfo | None

    @property
    def torch_version(self) -> Version | None:
        return self.torch.public_version if self.torch is not None else None

    def parsed(self) -> Iterator[tuple[_Wheel, WheelInfo]]:
        for wheel in self.wheels:
            if wheel.info is not None:
                yield wheel, wheel.info

    def violation(
        self, field: str, expected: str, found: str, fix: str, severity: Severity = "error"
    ) -> Violation:
        return Violation(
            cell=self.cell.id, field=field, expected=expected, found=found, fix=fix,
            severity=severity,
        )


def check_cells(cells: Iterable[Cell]) -> list[Violation]:
    """Every violation of every cell, cells in the order given."""
    return [v for cell in cells for v in check_cell(cell)]


def check_cell(cell: Cell) -> list[Violation]:
    """Every violation of one cell, in rule order."""
    wheels = tuple(_parse(path, pin) for path, pin in pinned_wheels(cell))
    torch = wheels[0].info
    ctx = _Context(cell=cell, wheels=wheels, torch=torch)
    found: list[Violation] = []
    for rule in _RULES:
        found.extend(rule(ctx))
    return found


def _parse(path: str, pin: PinnedWheel) -> _Wheel:
    try:
        info: WheelInfo | None = parse_wheel_filename(pin.filename)
    except ValidationError:
        info = None
    return _Wheel(path=path, pin=pin, info=info)


# --- wheel filenames and tags -----------------------------------------------------------


def _filenames(ctx: _Context) -> Iterator[Violation]:
    for wheel in ctx.wheels:
        if wheel.info is None:
            yield ctx.violation(
                f"{wheel.path}.filename",
                "a wheel filename NAME-VERSION-PYTHON-ABI-PLATFORM.whl",
                f"'{wheel.pin.filename}'",
                "copy the exact filename the wheel was published with",
            )
    torch = ctx.torch
    if torch is not None and torch.name != "torch":
        yield ctx.violation(
            "torch.filename", "a torch wheel", f"a {torch.dist} wheel ({torch.filename})",
            "pin the torch wheel in [torch]; other ABI-bound wheels go in vendor_wheels",
        )


def _python_tags(ctx: _Context) -> Iterator[Violation]:
    try:
        cpython_version(ctx.cell.python)
    except ValidationError as exc:
        yield ctx.violation("python", "a CPython tag like cp310", f"'{ctx.cell.python}'",
                            exc.message)
        return
    for wheel, info in ctx.parsed():
        if not python_tag_fits(info, ctx.cell.python):
            yield ctx.violation(
                f"{wheel.path}.filename",
                f"a wheel for {ctx.cell.python} ({ctx.cell.python}-{ctx.cell.python}, "
                "an older cpXY-abi3 or py3-none)",
                f"{info.python_tag}-{info.abi_tag} in {info.filename}",
                f"choose the {info.dist} wheel built for {ctx.cell.python}; never rename a file",
            )


def _platform_tags(ctx: _Context) -> Iterator[Violation]:
    cell = ctx.cell
    try:
        tuple(int(part) for part in cell.glibc.split("."))
    except ValueError:
        yield ctx.violation("glibc", "a glibc version like 2.35", f"'{cell.glibc}'",
                            "set glibc to the base image's glibc (ldd --version)")
        return
    for wheel, info in ctx.parsed():
        if platform_fits(info, glibc=cell.glibc, cpu_arch=cell.cpu_arch):
            continue
        needs = f" (needs glibc {info.glibc})" if info.glibc else ""
        yield ctx.violation(
            f"{wheel.path}.filename",
            f"a {cell.cpu_arch} wheel for glibc <= {cell.glibc}",
            f"platform {info.platform_tag}{needs}",
            f"choose the {info.dist} wheel built for {cell.cpu_arch} and glibc <= {cell.glibc}, "
            "or a base with a newer glibc",
        )


# --- versions encoded in vendor labels --------------------------------------------------


def _label_versions(ctx: _Context) -> Iterator[Violation]:
    for wheel, info in ctx.parsed():
        yield from _foreign_label(ctx, wheel, info)
        yield from _platform_version_in_label(ctx, wheel, info)
        yield from _torch_in_label(ctx, wheel, info)


def _label_builds(info: WheelInfo) -> list[tuple[str, str]]:
    """(platform, description) for every platform the label says the wheel is built for."""
    builds: list[tuple[str, str]] = []
    if info.vendor == "das":
        builds.append(("dtk", f"a DTK {info.dtk or '(version not named)'} build"))
    if info.rocm is not None:
        builds.append(("rocm", f"a ROCm {info.rocm} build"))
    if info.cuda is not None:
        builds.append(("cuda", f"a CUDA {info.cuda} build"))
    if info.cpu:
        builds.append(("cpu", "a CPU-only build"))
    return builds


def _foreign_label(ctx: _Context, wheel: _Wheel, info: WheelInfo) -> Iterator[Violation]:
    # torch's own label is judged by _torch_build, with a fix specific to torch.
    if wheel.path == "torch":
        return
    cell = ctx.cell
    foreign = [d for platform, d in _label_builds(info) if platform != cell.platform]
    for description in foreign:
        yield ctx.violation(
            f"{wheel.path}.filename",
            f"a {_platform_name(cell)} build",
            f"{description} (label {info.local})",
            f"choose the {info.dist} wheel built for {_platform_name(cell)}",
        )
    if cell.is_dtk and info.dtk is None and not foreign:
        # An unlabelled attention wheel cannot be a DTK build; other vendor wheels may
        # carry their own naming, so those only get a warning.
        severity: Severity = "error" if wheel.path == "attention" else "warning"
        yield ctx.violation(
            f"{wheel.path}.filename",
            f"a DAS build for DTK {cell.platform_version} (+das...dtk{_compact_dtk(cell)})",
            f"label {info.local}" if info.local else "no local label",
            f"choose the {info.dist} wheel from the DTK {cell.platform_version} release",
            severity,
        )


def _platform_version_in_label(
    ctx: _Context, wheel: _Wheel, info: WheelInfo
) -> Iterator[Violation]:
    cell = ctx.cell
    named = {"dtk": info.dtk, "rocm": info.rocm, "cuda": info.cuda}.get(cell.platform)
    if named is None or not cell.platform_version:
        return
    # DTK must match exactly (24.04.3 is not 24.04); CUDA/ROCm labels may name only the
    # major (upstream FlashAttention's cu12), so compare the components they give.
    exact = cell.is_dtk
    if named == cell.platform_version or (
        not exact and _prefix_equal(named, cell.platform_version)
    ):
        return
    name = _PLATFORM_NAMES[cell.platform]
    yield ctx.violation(
        f"{wheel.path}.filename",
        f"{name} {cell.platform_version}",
        f"{name} {named} in the label of {info.filename}",
        f"choose the {info.dist} wheel built for {name} {cell.platform_version}; "
        "never rename a file to make it fit",
    )


def _torch_in_label(ctx: _Context, wheel: _Wheel, info: WheelInfo) -> Iterator[Violation]:
    torch = ctx.torch_version
    if wheel.path == "torch" or torch is None:
        return
    if info.torch is None:
        if wheel.path == "attention":
            yield ctx.violation(
                f"{wheel.path}.filename", f"a label naming torch {torch}",
                f"label {info.local}" if info.local else "no local label",
                "confirm by hand that it was built against this torch (verify L3 runs it)",
                "warning",
            )
        return
    if _prefix_equal(info.torch, str(torch)):
        return
    yield ctx.violation(
        f"{wheel.path}.filename",
        f"torch {torch}",
        f"torch {info.torch} in the label of {info.filename}",
        f"choose the {info.dist} wheel built against torch {torch}; never rename a file",
    )


def _torch_build(ctx: _Context) -> Iterator[Violation]:
    """The torch wheel's label must name the cell's platform (facts: public torch has no DCU)."""
    info, cell = ctx.torch, ctx.cell
    if info is None:
        return
    found = f"torch {info.version}" + ("" if info.local else " (no local label)")
    expected, fix = "", ""
    if cell.is_dtk and info.dtk is None:
        expected = (
            f"a DAS vendor torch for DTK {cell.platform_version} "
            f"(+das...dtk{_compact_dtk(cell)})"
        )
        fix = ("pin the vendor torch from the DTK release (wheels/vendor/); "
               "the public index torch has no DCU backend")
    elif cell.platform == "rocm" and (info.rocm is None or info.vendor != "rocm"):
        expected = f"torch built for ROCm {cell.platform_version} (+rocm{cell.platform_version})"
        fix = f"pin torch from the PyTorch index for ROCm {cell.platform_version}"
    elif cell.platform == "cpu" and (not info.cpu or info.vendor is not None):
        expected = "a CPU-only torch (+cpu)"
        fix = "pin torch from the PyTorch CPU index (download.pytorch.org/whl/cpu)"
    elif cell.platform == "cuda" and (info.vendor not in (None, "cuda") or info.cpu):
        expected = "a CUDA torch (+cuXXX or no label)"
        fix = "pin a CUDA build of torch from the public index"
    if expected:
        yield ctx.violation("torch.filename", expected, found, fix)


def _cxx11abi(ctx: _Context) -> Iterator[Violation]:
    """Extensions and torch must share _GLIBCXX_USE_CXX11_ABI or fail to load (both known)."""
    want = ctx.torch.cxx11abi if ctx.torch is not None else None
    for wheel, info in ctx.parsed() if want is not None else ():
        if info.name != "torch" and info.cxx11abi not in (None, want):
            yield ctx.violation(
                f"{wheel.path}.filename", f"cxx11abi {str(want).upper()} like the torch wheel",
                f"cxx11abi {str(info.cxx11abi).upper()} ({info.filename})",
                "pin the build of this wheel made for the torch wheel's C++ ABI")


def _unknown_tokens(ctx: _Context) -> Iterator[Violation]:
    for wheel, info in ctx.parsed():
        if info.unknown_tokens:
            yield ctx.violation(
                f"{wheel.path}.filename",
                "only label tokens stackpin understands",
                f"unknown token(s) {', '.join(info.unknown_tokens)} in {info.local}",
                "check those by hand: stackpin cannot compare what it cannot read",
                "warning",
            )


# --- numpy ------------------------------------------------------------------------------


def _numpy(ctx: _Context) -> Iterator[Violation]:
    cell = ctx.cell
    try:
        spec = SpecifierSet(cell.numpy)
    except InvalidSpecifier:
        yield ctx.violation("numpy", "a version constraint like <2", f"'{cell.numpy}'",
                            "write a PEP 440 constraint, e.g. numpy = \"<2\"")
        return
    reason = _numpy1_reason(ctx)
    if reason and not excludes_numpy2(spec):
        yield ctx.violation(
            "numpy", "a constraint that excludes every numpy 2.x (e.g. <2)",
            f"numpy{cell.numpy}",
            f"set numpy = \"<2\": {reason} (numpy 2 breaks it at import or first op)",
        )
    yield from _stack_numpy(ctx, spec)


def _numpy1_reason(ctx: _Context) -> str:
    torch = ctx.torch_version
    if ctx.cell.is_dtk:
        return "DTK torch builds need numpy 1"
    if torch is not None and torch < _NUMPY2_TORCH:
        return f"torch {torch} (older than 2.3) was built against numpy 1"
    return ""


def excludes_numpy2(spec: SpecifierSet) -> bool:
    """Whether the constraint admits no numpy >= 2 (pre-releases of 2.0 included).

    One of its clauses must do it alone (<2, <=1.26.4, ==1.26.*, ~=1.26); a clause that
    is not an upper bound (>=, !=) never does. This refuses exotic sets such as
    '!=2.*,<3' that exclude 2.x only together: write <2 instead.
    """
    return any(_clause_excludes_numpy2(clause) for clause in spec)


def _clause_excludes_numpy2(clause: Specifier) -> bool:
    op, raw = clause.operator, clause.version
    try:
        if op == "==" and raw.endswith(".*"):
            return Version(raw[:-2]).release[0] < 2
        version = Version(raw)
    except InvalidVersion:
        return False
    if op == "<":
        # '<2' also refuses 2.0.0rc1 (PEP 440); '<2.0.0rc2' would admit it.
        return version <= _NUMPY2_FIRST or version == Version("2")
    if op in ("<=", "==", "==="):
        return version < _NUMPY2_FIRST
    if op == "~=":
        return version.release[0] < 2
    return False


def _stack_numpy(ctx: _Context, spec: SpecifierSet) -> Iterator[Violation]:
    key = _stack_key(ctx.cell, "numpy")
    if key is None:
        return
    pinned = ctx.cell.stack[key]
    try:
        fits = spec.contains(Version(pinned), prereleases=True)
    except InvalidVersion:
        fits = False
    if not fits:
        yield ctx.violation(
            f"stack.{key}", f"a numpy version satisfying numpy{ctx.cell.numpy}",
            f"numpy {pinned}",
            "pin a numpy release inside the constraint (or fix the constraint)",
        )


# --- variants, bitsandbytes, environment -----------------------------------------------


def _attention(ctx: _Context) -> Iterator[Violation]:
    cell = ctx.cell
    enhanced = Variant.ENHANCED in cell.variants
    if cell.attention is not None and not enhanced:
        yield ctx.violation(
            "attention", f"no attention wheel (variants: {', '.join(cell.variants)})",
            cell.attention.filename,
            "add \"enhanced\" to variants, or remove the [attention] table",
        )
    if enhanced and cell.attention is None:
        yield ctx.violation(
            "variants", "an [attention] wheel for the enhanced variant", "none",
            "pin the FlashAttention wheel in [attention], or drop \"enhanced\" from variants",
        )


def _bitsandbytes(ctx: _Context) -> Iterator[Violation]:
    cell = ctx.cell
    vendor_bnb = any(
        w.info is not None and w.info.name == "bitsandbytes" and w.path.startswith("vendor")
        for w in ctx.wheels
    )
    if vendor_bnb != (cell.bitsandbytes == "vendor"):
        expected = "'vendor' (a vendor bitsandbytes wheel is pinned)" if vendor_bnb else (
            "a vendor bitsandbytes wheel in vendor_wheels (bitsandbytes = 'vendor')"
        )
        yield ctx.violation(
            "bitsandbytes", expected, f"'{cell.bitsandbytes}'",
            "pin the vendor wheel and set bitsandbytes = \"vendor\", or neither",
        )
    if not cell.is_dtk or vendor_bnb:
        return
    # Facts: no trusted DTK build; a generic wheel claims ROCm support, then fails.
    why = "no trusted DTK build exists (a generic wheel claims ROCm support, then fails)"
    if cell.bitsandbytes != "disabled":
        yield ctx.violation("bitsandbytes", "'disabled'", f"'{cell.bitsandbytes}'",
                            f"set bitsandbytes = \"disabled\": {why}")
    if cell.env.get(_BNB_ENV) != "1":
        found = f"'{cell.env[_BNB_ENV]}'" if _BNB_ENV in cell.env else "unset"
        yield ctx.violation(f"env.{_BNB_ENV}", "'1'", found,
                            f"set {_BNB_ENV} = \"1\" in [env]: {why}")
    key = _stack_key(cell, "bitsandbytes")
    if key is not None:
        yield ctx.violation(f"stack.{key}", "no bitsandbytes from the index on DTK",
                            f"bitsandbytes {cell.stack[key]}",
                            f"remove it from [stack]: {why}")


def _environment(ctx: _Context) -> Iterator[Violation]:
    cell = ctx.cell
    if cell.is_dtk and not cell.env_script:
        yield ctx.violation(
            "env_script", "the DTK env.sh (e.g. /opt/dtk/env.sh)", "empty",
            "set env_script: every build step and the entrypoint must source it",
        )
    if cell.platform != "cpu" and not cell.platform_version:
        yield ctx.violation(
            "platform_version", f"the {cell.platform} version (e.g. 26.04, 6.4, 12.8)", "empty",
            "set platform_version so wheel labels can be checked against it",
        )
    lld = cell.env.get(_LLD_ENV)
    if lld is not None and not lld.endswith("/ld.lld"):
        yield ctx.violation(
            f"env.{_LLD_ENV}", "a path to a file named exactly ld.lld", f"'{lld}'",
            "point it at .../ld.lld: a file named lld fails at HSACO link "
            "(PassManager::run failed)",
        )


def _stack_overlaps(ctx: _Context) -> Iterator[Violation]:
    # pip would replace a --no-deps vendor wheel with the index version named in [stack].
    for wheel, info in ctx.parsed():
        key = _stack_key(ctx.cell, info.name)
        if key is None:
            continue
        what = "torch is pinned by its wheel only" if wheel.path == "torch" else (
            f"{info.dist} is pinned by {wheel.path}"
        )
        yield ctx.violation(
            f"stack.{key}", f"no {key} in [stack] ({what})", f"{key} {ctx.cell.stack[key]}",
            f"remove {key} from [stack] so pip cannot replace the pinned wheel",
        )


# --- base image -------------------------------------------------------------------------


def _base(ctx: _Context) -> Iterator[Violation]:
    cell = ctx.cell
    ref = parse_base_reference(cell.base.image) if cell.base.image else None
    if ref is None:
        return
    if not cell.is_dtk:
        yield ctx.violation("base.image", f"a {_platform_name(cell)} base",
                            f"a DTK {ref.dtk} base ({cell.base.image})",
                            "use a base for this cell's platform")
        return
    if ref.dtk != cell.platform_version:
        yield ctx.violation("base.image", f"dtk{cell.platform_version} in the tag",
                            f"dtk{ref.dtk}", "use the base tag of this cell's DTK release")
    python = _dotted_python(cell.python)
    if python is not None and ref.python != python:
        yield ctx.violation("base.image", f"py{python} in the tag", f"py{ref.python}",
                            f"use the base tag built for Python {python}")
    torch = ctx.torch_version
    is_pytorch = ref.stack == "pytorch" or ref.stack.endswith("-pytorch")
    if is_pytorch and torch is not None and not _same_version(ref.stack_version, torch):
        yield ctx.violation(
            "base.image", f"pytorch {torch} in the tag (the pinned torch)",
            f"pytorch {ref.stack_version}",
            "use the base tag for the pinned torch, or pin the torch that base ships",
        )


# --- unpinned hashes ------------------------------------------------------------------


def _unpinned(ctx: _Context) -> Iterator[Violation]:
    cell = ctx.cell
    for wheel in ctx.wheels:
        if wheel.pin.sha256:
            continue
        command = (
            f"sha256sum wheels/vendor/{wheel.pin.filename}"
            if wheel.pin.source == "vendor"
            else f"stackpin wheels fetch {cell.id}"
        )
        yield ctx.violation(
            f"{wheel.path}.sha256", "a sha256 (64 hex digits)", "empty (unpinned)",
            f"pin it with `{command}`; build refuses unpinned wheels", "warning",
        )
    if cell.base.image and not cell.base.digest:
        yield ctx.violation(
            "base.digest", "sha256:<64 hex> of the base", "empty (unpinned)",
            f"pin it with `docker image inspect --format '{{{{.Id}}}}' {cell.base.image}` "
            "after pulling or loading the base",
            "warning",
        )


# --- helpers ----------------------------------------------------------------------------


def _stack_key(cell: Cell, dist: str) -> str | None:
    """The [stack] key naming this distribution (PEP 503 names compare equal)."""
    wanted = canonicalize_name(dist)
    return next((k for k in cell.stack if canonicalize_name(k) == wanted), None)


def _prefix_equal(named: str, full: str) -> bool:
    """'12' equals '12.8' and '2.8' equals '2.8.0'; '2.9.0' differs from '2.10.0'."""
    try:
        short, long = Version(named).release, Version(full).release
    except InvalidVersion:
        return named == full
    long = long + (0,) * max(0, len(short) - len(long))
    return short == long[: len(short)]


def _same_version(text: str, version: Version) -> bool:
    try:
        return Version(text) == version
    except InvalidVersion:
        return False


def _dotted_python(tag: str) -> str | None:
    try:
        major, minor = cpython_version(tag)
    except ValidationError:
        return None
    return f"{major}.{minor}"


def _compact_dtk(cell: Cell) -> str:
    return cell.platform_version.replace(".", "")


def _platform_name(cell: Cell) -> str:
    name = _PLATFORM_NAMES[cell.platform]
    return f"{name} {cell.platform_version}" if cell.platform_version else name


def _boundary(ctx: _Context) -> Iterator[Violation]:
    for field, expected, found, fix, level in declaration_problems(ctx.cell):
        yield ctx.violation(field, expected, found, fix, "warning" if level == "warning" else
                            "error")


_RULES: tuple[Callable[[_Context], Iterator[Violation]], ...] = (
    _boundary,
    _filenames,
    _python_tags,
    _platform_tags,
    _torch_build,
    _cxx11abi,
    _label_versions,
    _unknown_tokens,
    _numpy,
    _attention,
    _bitsandbytes,
    _environment,
    _stack_overlaps,
    _base,
    _unpinned,
)
