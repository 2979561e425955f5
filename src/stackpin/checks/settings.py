"""Cross-checks of a cell's settings: numpy, variants, bitsandbytes, environment, base, hashes.

Each rule reads a Context and yields Violations (see checks.context).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackpin import platforms
from stackpin.abi import cpython_version
from stackpin.boundary import declaration_problems
from stackpin.checks.context import Context, Violation, platform_name
from stackpin.errors import ValidationError
from stackpin.matrix import Cell, Variant

# torch releases before 2.3 were built against numpy 1 only (numpy 2 support came in 2.3).
_NUMPY2_TORCH = Version("2.3")
# The smallest version that counts as numpy 2: its first development release.
_NUMPY2_FIRST = Version("2.dev0")
_BNB_ENV = "UNSLOTH_DISABLE_BITSANDBYTES"
_LLD_ENV = "TRITON_HIP_LLD_PATH"


def boundary(ctx: Context) -> Iterator[Violation]:
    """The declarations' own rules (provided, excluded, dropped; stackpin.boundary)."""
    for field, expected, found, fix, level in declaration_problems(ctx.cell):
        yield ctx.violation(field, expected, found, fix, "warning" if level == "warning" else
                            "error")


# --- numpy ------------------------------------------------------------------------------


def _numpy(ctx: Context) -> Iterator[Violation]:
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


def _numpy1_reason(ctx: Context) -> str:
    torch = ctx.torch_version
    if ctx.cell.spec.numpy1:
        return ctx.cell.spec.numpy1
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


def _stack_numpy(ctx: Context, spec: SpecifierSet) -> Iterator[Violation]:
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


def _attention(ctx: Context) -> Iterator[Violation]:
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


def _bitsandbytes(ctx: Context) -> Iterator[Violation]:
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
    # Facts: no trusted DTK build; a generic wheel claims ROCm support, then fails.
    why = cell.spec.bitsandbytes_untrusted
    if not why or vendor_bnb:
        return
    if cell.bitsandbytes != "disabled":
        yield ctx.violation("bitsandbytes", "'disabled'", f"'{cell.bitsandbytes}'",
                            f"set bitsandbytes = \"disabled\": {why}")
    if cell.env.get(_BNB_ENV) != "1":
        found = f"'{cell.env[_BNB_ENV]}'" if _BNB_ENV in cell.env else "unset"
        yield ctx.violation(f"env.{_BNB_ENV}", "'1'", found,
                            f"set {_BNB_ENV} = \"1\" in [env]: {why}")
    key = _stack_key(cell, "bitsandbytes")
    if key is not None:
        yield ctx.violation(f"stack.{key}", f"no bitsandbytes from the index on {cell.spec.title}",
                            f"bitsandbytes {cell.stack[key]}",
                            f"remove it from [stack]: {why}")


def _environment(ctx: Context) -> Iterator[Violation]:
    cell = ctx.cell
    spec = cell.spec
    if spec.env_script_example and not cell.env_script:
        yield ctx.violation(
            "env_script", f"the {spec.title} env.sh (e.g. {spec.env_script_example})", "empty",
            "set env_script: every build step and the entrypoint must source it",
        )
    if spec.version_example and not cell.platform_version:
        yield ctx.violation(
            "platform_version", f"the {cell.platform} version (e.g. {spec.version_example})",
            "empty", "set platform_version so wheel labels can be checked against it",
        )
    lld = cell.env.get(_LLD_ENV)
    if lld is not None and not lld.endswith("/ld.lld"):
        yield ctx.violation(
            f"env.{_LLD_ENV}", "a path to a file named exactly ld.lld", f"'{lld}'",
            "point it at .../ld.lld: a file named lld fails at HSACO link "
            "(PassManager::run failed)",
        )


def _stack_overlaps(ctx: Context) -> Iterator[Violation]:
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


def _base(ctx: Context) -> Iterator[Violation]:
    cell = ctx.cell
    ref = platforms.base_tag(cell.base.image) if cell.base.image else None
    if ref is None:
        return
    if ref.platform != cell.platform:
        made_for = platforms.get(ref.platform).titled(ref.version)
        yield ctx.violation("base.image", f"a {platform_name(cell)} base",
                            f"a {made_for} base ({cell.base.image})",
                            "use a base for this cell's platform")
        return
    if ref.version != cell.platform_version:
        yield ctx.violation("base.image", f"{ref.platform}{cell.platform_version} in the tag",
                            f"{ref.platform}{ref.version}",
                            f"use the base tag of this cell's {cell.spec.title} release")
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


def _unpinned(ctx: Context) -> Iterator[Violation]:
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


# In the order they report (boundary, the declarations' own rule, runs first: see checks).
RULES: tuple[Callable[[Context], Iterator[Violation]], ...] = (
    _numpy,
    _attention,
    _bitsandbytes,
    _environment,
    _stack_overlaps,
    _base,
    _unpinned,
)
