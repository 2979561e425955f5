"""Cross-checks of a cell's pinned wheels: filenames, tags and the versions vendor labels encode.

Each rule reads the parsed wheels of a Context and yields Violations (see checks.context).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from packaging.version import InvalidVersion, Version

from stackpin import platforms
from stackpin.abi import WheelInfo, cpython_version, platform_fits, python_tag_fits
from stackpin.checks.context import Context, Severity, Violation, Wheel, platform_name
from stackpin.errors import ValidationError
from stackpin.platforms.spec import filled

# --- wheel filenames and tags -----------------------------------------------------------


def _filenames(ctx: Context) -> Iterator[Violation]:
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


def _python_tags(ctx: Context) -> Iterator[Violation]:
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


def _platform_tags(ctx: Context) -> Iterator[Violation]:
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


def _label_versions(ctx: Context) -> Iterator[Violation]:
    for wheel, info in ctx.parsed():
        yield from _foreign_label(ctx, wheel, info)
        yield from _platform_version_in_label(ctx, wheel, info)
        yield from _torch_in_label(ctx, wheel, info)


def _label_builds(info: WheelInfo) -> list[tuple[str, str]]:
    """(platform, description) for every platform the label says the wheel is built for."""
    builds: list[tuple[str, str]] = []
    for spec in platforms.specs():
        if spec.name in info.builds:
            version = info.builds[spec.name] or "(version not named)"
            builds.append((spec.name, spec.label.build.format(title=spec.title,
                                                               version=version)))
    return builds


def _foreign_label(ctx: Context, wheel: Wheel, info: WheelInfo) -> Iterator[Violation]:
    # torch's own label is judged by _torch_build, with a fix specific to torch.
    if wheel.path == "torch":
        return
    cell = ctx.cell
    foreign = [d for platform, d in _label_builds(info) if platform != cell.platform]
    for description in foreign:
        yield ctx.violation(
            f"{wheel.path}.filename",
            f"a {platform_name(cell)} build",
            f"{description} (label {info.local})",
            f"choose the {info.dist} wheel built for {platform_name(cell)}",
        )
    rule = cell.spec.vendor_labels
    if rule is not None and info.names_version(cell.platform) is None and not foreign:
        # An unlabelled attention wheel cannot be a vendor build; other vendor wheels may
        # carry their own naming, so those only get a warning.
        severity: Severity = "error" if wheel.path == "attention" else "warning"
        yield ctx.violation(
            f"{wheel.path}.filename",
            filled(rule.expected, cell.platform_version),
            f"label {info.local}" if info.local else "no local label",
            filled(rule.fix, cell.platform_version, dist=info.dist),
            severity,
        )


def _platform_version_in_label(
    ctx: Context, wheel: Wheel, info: WheelInfo
) -> Iterator[Violation]:
    cell = ctx.cell
    spec = cell.spec
    named = info.names_version(cell.platform) if spec.label.version_token else None
    if named is None or not cell.platform_version:
        return
    # DTK must match exactly (24.04.3 is not 24.04); CUDA/ROCm labels may name only the
    # major (upstream FlashAttention's cu12), so compare the components they give.
    if named == cell.platform_version or (
        not spec.label.exact_version and _prefix_equal(named, cell.platform_version)
    ):
        return
    name = spec.title
    yield ctx.violation(
        f"{wheel.path}.filename",
        f"{name} {cell.platform_version}",
        f"{name} {named} in the label of {info.filename}",
        f"choose the {info.dist} wheel built for {name} {cell.platform_version}; "
        "never rename a file to make it fit",
    )


def _torch_in_label(ctx: Context, wheel: Wheel, info: WheelInfo) -> Iterator[Violation]:
    torch = ctx.torch_version
    if wheel.path == "torch" or torch is None:
        return
    if info.torch is None:
        # A pure-Python wheel (FlashAttention 4 compiles its kernels at run time) holds no
        # binary built against any torch: there is nothing a label could name.
        pure = info.abi_tag == "none" and info.platform_tag == "any"
        if wheel.path == "attention" and not pure:
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


def _torch_build(ctx: Context) -> Iterator[Violation]:
    """The torch wheel's label must name the cell's platform (facts: public torch has no DCU)."""
    info, cell = ctx.torch, ctx.cell
    if info is None or _torch_label_fits(info, cell.spec):
        return
    found = f"torch {info.version}" + ("" if info.local else " (no local label)")
    rule = cell.spec.torch
    yield ctx.violation("torch.filename", filled(rule.expected, cell.platform_version), found,
                        filled(rule.fix, cell.platform_version))


def _torch_label_fits(info: WheelInfo, spec: platforms.PlatformSpec) -> bool:
    rule = spec.torch
    if rule.names_version and info.names_version(spec.name) is None:
        return False
    if rule.marks and spec.name not in info.builds:
        return False
    if rule.vendors and (info.vendor or "") not in rule.vendors:
        return False
    return not any(other in info.builds for other in rule.forbids)


def _cxx11abi(ctx: Context) -> Iterator[Violation]:
    """Extensions and torch must share _GLIBCXX_USE_CXX11_ABI or fail to load (both known)."""
    want = ctx.torch.cxx11abi if ctx.torch is not None else None
    for wheel, info in ctx.parsed() if want is not None else ():
        if info.name != "torch" and info.cxx11abi not in (None, want):
            yield ctx.violation(
                f"{wheel.path}.filename", f"cxx11abi {str(want).upper()} like the torch wheel",
                f"cxx11abi {str(info.cxx11abi).upper()} ({info.filename})",
                "pin the build of this wheel made for the torch wheel's C++ ABI")


def _unknown_tokens(ctx: Context) -> Iterator[Violation]:
    for wheel, info in ctx.parsed():
        if info.unknown_tokens:
            yield ctx.violation(
                f"{wheel.path}.filename",
                "only label tokens stackpin understands",
                f"unknown token(s) {', '.join(info.unknown_tokens)} in {info.local}",
                "check those by hand: stackpin cannot compare what it cannot read",
                "warning",
            )


# --- helpers ----------------------------------------------------------------------------


def _prefix_equal(named: str, full: str) -> bool:
    """'12' equals '12.8' and '2.8' equals '2.8.0'; '2.9.0' differs from '2.10.0'."""
    try:
        short, long = Version(named).release, Version(full).release
    except InvalidVersion:
        return named == full
    long = long + (0,) * max(0, len(short) - len(long))
    return short == long[: len(short)]


# In the order they report.
RULES: tuple[Callable[[Context], Iterator[Violation]], ...] = (
    _filenames,
    _python_tags,
    _platform_tags,
    _torch_build,
    _cxx11abi,
    _label_versions,
    _unknown_tokens,
)
