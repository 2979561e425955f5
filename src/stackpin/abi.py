"""Wheel filenames and their local-version labels, parsed into facts the checks compare.

Pure: every function takes strings and returns values; nothing here reads files, the
environment or the running interpreter (packaging's tag generators are always given an
explicit Python version, ABI list and platform list for that reason).

A local-version label (the part after ``+``) is read left to right as a sequence of
known tokens. Tokens may be separated by ``.``, ``_`` or ``-``, or follow each other
directly (upstream FlashAttention writes ``cu12torch2.8cxx11abiTRUE``). Known tokens:

==================  =========================================================  ==========
token               meaning                                                    example
==================  =========================================================  ==========
``das[N[.M]]``      Hygon DAS vendor build (N, N.M: the DAS release)           das185
``optN``            DAS optimisation level                                     opt1
``dtkYYMM[P]``      DTK version: YY.MM, a fifth digit is the point release     dtk24043
``dtkYY.MM[.P]``    DTK version, dotted                                        dtk26.04
``torchDDD``        torch version, compact (rule below)                        torch2100
``torchX.Y[.Z]``    torch version, dotted (upstream FlashAttention)            torch2.8
``cuNN[N]``         CUDA: two digits = major only, more = NN.N                 cu128
``rocmX.Y[.Z]``     ROCm version                                               rocm6.4
``cpu``             PyTorch CPU-only build                                     cpu
``cxx11abiTRUE``    built with _GLIBCXX_USE_CXX11_ABI=1 (FALSE: =0)            cxx11abiTRUE
``cxx11.abi``       PyTorch's CPU cxx11-ABI build suffix (= cxx11abi true)     cpu.cxx11.abi
``abiN``            the DAS build's own ABI flag (kept, not interpreted)       abi1
``gitHASH``         source commit, 7-40 hex digits                             git3ac1bdd
``gHASH``           source commit in ``git describe`` form                     g1a2b3c4
``YYYYMMDD[hhmm]``  build date (8, 12 or 14 digits that form a real date)      202510021530
==================  =========================================================  ==========

Compact torch rule: the first digit is the major, the last digit is the patch and the
digits between are the minor, so ``torch290`` is 2.9.0, ``torch2100`` is 2.10.0 and
``torch2110`` is 2.11.0 (two digits are major.minor: ``torch28`` is 2.8). This assumes a
one-digit major and a one-digit patch, which holds for every torch release so far.

Anything else is an *unknown* token: it is kept in ``unknown_tokens`` and shown, never
dropped silently, so a new vendor label form is noticed instead of half-parsed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath

from packaging.tags import Tag, compatible_tags, cpython_tags, parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name
from packaging.utils import parse_wheel_filename as _packaging_parse_wheel_filename
from packaging.version import Version

from stackpin import platforms
from stackpin.errors import ValidationError
from stackpin.untrusted import shown

# What a token means: one of the generic kinds below, a kind a platform's label declares
# (stackpin.platforms: das, dtk, cu, rocm, cpu, ...), or "unknown".
TokenKind = str

# Order matters where one pattern is a prefix of another (cxx11abiTRUE before cxx11.abi,
# dotted torch before compact torch). Each group 'v' is the raw value the token carries.
# The platforms' tokens go between the ABI flag and the rest (``_token_sources``).
_ABI_SOURCES: tuple[tuple[TokenKind, str], ...] = (
    ("cxx11abi", r"cxx11abi(?P<v>true|false)"),
    ("cxx11abi", r"cxx11[._]abi(?P<v>)(?![0-9a-z])"),
)
_GENERIC_SOURCES: tuple[tuple[TokenKind, str], ...] = (
    ("opt", r"opt(?P<v>\d+)"),
    ("torch", r"torch(?P<v>\d{1,2}\.\d{1,2}(?:\.\d{1,2})?)(?!\d)"),
    ("torch", r"torch(?P<v>\d{2,5})(?!\d)"),
    ("abi", r"abi(?P<v>\d)(?![0-9a-z])"),
    ("git", r"git(?P<v>[0-9a-f]{7,40})(?![0-9a-z])"),
    ("git", r"g(?P<v>[0-9a-f]{7,40})(?![0-9a-z])"),
    ("date", r"(?P<v>\d{14}|\d{12}|\d{8})(?![0-9a-z])"),
)


@functools.cache
def _token_patterns() -> tuple[tuple[TokenKind, re.Pattern[str]], ...]:
    platform_sources = [(t.kind, t.pattern) for spec in platforms.specs()
                        for t in spec.label.tokens]
    sources = [*_ABI_SOURCES, *platform_sources, *_GENERIC_SOURCES]
    return tuple((kind, re.compile(src, re.IGNORECASE)) for kind, src in sources)


_SEPARATORS = "._-"
_DATE_FORMATS = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}

# PEP 600 aliases of the legacy manylinux tags (PEP 513, 571, 599).
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"^manylinux_(?P<major>\d+)_(?P<minor>\d+)_(?P<arch>.+)$")
_LEGACY = re.compile(r"^(?P<name>manylinux1|manylinux2010|manylinux2014)_(?P<arch>.+)$")
_LINUX = re.compile(r"^linux_(?P<arch>.+)$")
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
NAME_MAX = 255  # the longest file name Linux file systems hold
_CPYTHON_TAG = re.compile(r"^cp(?P<major>\d)(?P<minor>\d{1,2})$")


@dataclass(frozen=True, kw_only=True)
class LabelToken:
    """One token of a local-version label: its kind, the text as written, its value."""

    kind: TokenKind
    text: str
    value: str


@dataclass(frozen=True, kw_only=True)
class WheelInfo:
    """What a wheel filename says about the ABI it was built for."""

    filename: str
    dist: str
    version: str
    local: str | None
    python_tag: str
    abi_tag: str
    platform_tag: str
    glibc: str | None
    vendor: str | None
    # Every platform the label marks, with the version it names there ("" for none).
    builds: Mapping[str, str] = field(default_factory=dict)
    torch: str | None
    cxx11abi: bool | None
    tokens: tuple[LabelToken, ...] = field(default=())
    unknown_tokens: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        """The canonical (PEP 503) distribution name, for comparisons."""
        return canonicalize_name(self.dist)

    @property
    def public_version(self) -> Version:
        """The version without its local label."""
        return Version(Version(self.version).public)

    def names_version(self, platform: str) -> str | None:
        """The version the label names for ``platform`` (26.04 for +das.opt1.dtk2604), or None."""
        return self.builds.get(platform) or None

    @property
    def tags(self) -> frozenset[Tag]:
        return parse_tag(f"{self.python_tag}-{self.abi_tag}-{self.platform_tag}")

    def to_json(self) -> dict[str, object]:
        """The public ``stackpin wheel inspect --json`` form (keys are a contract)."""
        return {
            "dist": self.dist,
            "version": self.version,
            "local": self.local,
            "python_tag": self.python_tag,
            "abi_tag": self.abi_tag,
            "platform_tag": self.platform_tag,
            "glibc": self.glibc,
            "vendor": self.vendor,
            # One key per platform whose label names a version (dtk, rocm, cuda).
            **{spec.name: self.names_version(spec.name) for spec in platforms.specs()
               if spec.label.version_token},
            "torch": self.torch,
            "cxx11abi": self.cxx11abi,
            "unknown_tokens": list(self.unknown_tokens),
        }


def parse_wheel_filename(filename: str) -> WheelInfo:
    """Parse ``NAME-VERSION[-BUILD]-PY-ABI-PLATFORM.whl`` (a leading directory is ignored).

    Raises ValidationError with a one-line message when the name is not a wheel filename.
    """
    base = PurePosixPath(filename).name
    if len(base) > NAME_MAX:
        # Also the bound on every number inside: no int() of a name meets Python's limit.
        msg = (f"not a wheel filename: {len(base)} characters, and no file system holds a "
               f"name of more than {NAME_MAX} ('{shown(filename, limit=60)}')")
        raise ValidationError(msg)
    try:
        _, version, _, _ = _packaging_parse_wheel_filename(base)
    except InvalidWheelFilename as exc:
        msg = (
            f"'{filename}' is not a valid wheel filename ({exc}); expected "
            "NAME-VERSION-PYTHON-ABI-PLATFORM.whl as built, never renamed"
        )
        raise ValidationError(msg) from None
    parts = base[: -len(".whl")].split("-")
    dist, written_version = parts[0], parts[1]
    python_tag, abi_tag, platform_tag = parts[-3:]
    local = written_version.split("+", 1)[1] if "+" in written_version else None
    tokens = tokenize_label(local or "")
    values = {t.kind: t.value for t in reversed(tokens)}  # first occurrence wins
    is_torch = canonicalize_name(dist) == "torch"
    return WheelInfo(
        filename=base,
        dist=dist,
        version=written_version,
        local=local,
        python_tag=python_tag,
        abi_tag=abi_tag,
        platform_tag=platform_tag,
        glibc=glibc_floor(platform_tag),
        vendor=_vendor(values),
        builds=_builds(values),
        torch=version.public if is_torch else _torch_from_label(values.get("torch")),
        cxx11abi=_cxx11abi(values.get("cxx11abi")),
        tokens=tokens,
        unknown_tokens=tuple(t.text for t in tokens if t.kind == "unknown"),
    )


def tokenize_label(label: str) -> tuple[LabelToken, ...]:
    """Split a local-version label into known tokens; the rest become unknown tokens."""
    tokens: list[LabelToken] = []
    pos = 0
    while pos < len(label):
        if label[pos] in _SEPARATORS:
            pos += 1
            continue
        token, pos = _next_token(label, pos)
        tokens.append(token)
    return tuple(tokens)


def _next_token(label: str, pos: int) -> tuple[LabelToken, int]:
    for kind, pattern in _token_patterns():
        match = pattern.match(label, pos)
        if match is None or (kind == "date" and not _is_date(match.group("v"))):
            continue
        token = LabelToken(kind=kind, text=match.group(0), value=match.group("v") or "")
        return token, match.end()
    end = pos
    while end < len(label) and label[end] not in _SEPARATORS:
        end += 1
    return LabelToken(kind="unknown", text=label[pos:end], value=label[pos:end]), end


def _is_date(digits: str) -> bool:
    try:
        datetime.strptime(digits, _DATE_FORMATS[len(digits)])
    except ValueError:
        return False
    return True


def _marks(values: Mapping[TokenKind, str], spec: platforms.PlatformSpec) -> bool:
    return any(token.kind in values for token in spec.label.tokens)


def _vendor(values: Mapping[TokenKind, str]) -> str | None:
    """The vendor of the first platform (by rank) the label marks: a DAS label wins, as
    DAS builds are HIP builds whose runtime is DTK, not ROCm."""
    return next((spec.label.vendor for spec in platforms.specs()
                 if spec.label.vendor and _marks(values, spec)), None)


def _builds(values: Mapping[TokenKind, str]) -> dict[str, str]:
    """Every platform the label marks, with the version it names ("" when it names none)."""
    found = {}
    for spec in platforms.specs():
        if _marks(values, spec):
            raw = values.get(spec.label.version_token) if spec.label.version_token else None
            found[spec.name] = spec.label.version_of(raw) if raw else ""
    return found


def _torch_from_label(raw: str | None) -> str | None:
    """Decode a torch token value by the compact rule in the module docstring."""
    if raw is None:
        return None
    if "." in raw:
        return raw
    if len(raw) == 2:
        return f"{raw[0]}.{raw[1]}"
    return f"{raw[0]}.{int(raw[1:-1])}.{raw[-1]}"


def _cxx11abi(raw: str | None) -> bool | None:
    if raw is None:
        return None
    # 'cxx11.abi' carries no value: its presence means the new ABI.
    return raw.lower() != "false"


# --- tag fitting ----------------------------------------------------------------------


def glibc_floor(platform_tag: str) -> str | None:
    """The lowest glibc any manylinux tag of a (compressed) platform tag needs, or None."""
    floors = [f for f in (_manylinux_floor(p) for p in platform_tag.split(".")) if f]
    if not floors:
        return None
    major, minor = min(floors)
    return f"{major}.{minor}"


def _manylinux_floor(platform: str) -> tuple[int, int] | None:
    if match := _MANYLINUX.match(platform):
        return int(match["major"]), int(match["minor"])
    if match := _LEGACY.match(platform):
        return _LEGACY_MANYLINUX[match["name"]]
    return None


def cpython_version(cpython_tag: str) -> tuple[int, int]:
    """``cp310`` -> (3, 10); ValidationError for anything that is not a CPython tag."""
    match = _CPYTHON_TAG.match(cpython_tag)
    if match is None:
        msg = f"'{cpython_tag}' is not a CPython tag; write it like cp310"
        raise ValidationError(msg)
    return int(match["major"]), int(match["minor"])


def python_tag_fits(info: WheelInfo, cpython_tag: str) -> bool:
    """Whether the wheel's interpreter/ABI tags install on that CPython.

    cp310-cp310 fits cp310 only; cp38-abi3 fits every CPython >= 3.8; py3-none fits all.
    The platform part is judged separately by platform_fits.
    """
    version = cpython_version(cpython_tag)
    wanted = {
        (t.interpreter, t.abi)
        for t in (
            *cpython_tags(version, abis=[cpython_tag], platforms=["any"]),
            *compatible_tags(version, interpreter=cpython_tag, platforms=["any"]),
        )
    }
    return any((t.interpreter, t.abi) in wanted for t in info.tags)


def platform_fits(info: WheelInfo, *, glibc: str, cpu_arch: str) -> bool:
    """Whether one of the wheel's platform tags runs on that glibc and CPU architecture.

    ``any`` fits everywhere. manylinux tags fit when their glibc floor is <= the cell's
    glibc and the arch matches. ``linux_<arch>`` fits on a matching arch, but it promises
    nothing about glibc (upstream FlashAttention ships that way): only running it proves
    it. musllinux, macOS and Windows tags never fit a glibc Linux image.
    """
    arch = _ARCH_ALIASES.get(cpu_arch, cpu_arch)
    have = _glibc_tuple(glibc)
    return any(_platform_fits(p, have, arch) for p in info.platform_tag.split("."))


def _platform_fits(platform: str, have: tuple[int, ...], arch: str) -> bool:
    if platform == "any":
        return True
    match = _MANYLINUX.match(platform) or _LEGACY.match(platform) or _LINUX.match(platform)
    if match is None or _ARCH_ALIASES.get(match["arch"], match["arch"]) != arch:
        return False
    floor = _manylinux_floor(platform)
    return floor is None or floor <= have


def _glibc_tuple(glibc: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in glibc.split("."))
    except ValueError:
        msg = f"'{glibc}' is not a glibc version; write it like 2.35"
        raise ValidationError(msg) from None
