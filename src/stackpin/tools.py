"""Build tools pinned apart from the cells' locks: the installer (uv) every build runs.

The pin is ``pinning/tools/installer.toml`` (a tool bump must not move any cell's lock
digest); the wheel lives in ``wheels/tools/``. ``stackpin wheels fetch`` downloads it,
hash-checked; a build refuses a missing or changed file before Docker starts and stages it
into the context as ``tools/<wheel>``, where the Dockerfile checks its sha256 again before
running the binary it holds.
"""

from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tomllib

from stackpin.errors import ConfigurationError, HostEnvironmentError, ValidationError
from stackpin.piptarget import LineSink, Runner, subprocess_runner
from stackpin.primitives import sha256_file

PIN = Path("pinning") / "tools" / "installer.toml"
TOOLS_DIR = Path("wheels") / "tools"
CONTEXT_DIR = "tools"  # in a build context: tools/<wheel>
_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+-]{0,63}")
# A wheel file name of the pinned version, no folder part (it is joined to wheels/tools/).
_WHEEL = re.compile(r"uv-(?P<version>[0-9][0-9A-Za-z.+]*)-py3-none-[A-Za-z0-9_.]+\.whl")
_MEMBER = re.compile(r"uv-(?P<version>[0-9][0-9A-Za-z.+]*)\.data/scripts/uv")


@dataclass(frozen=True, kw_only=True)
class Installer:
    """uv's pinned wheel and the member of it that is the binary."""

    version: str
    wheel: str
    sha256: str
    binary: str

    def path(self, root: Path) -> Path:
        return root / TOOLS_DIR / self.wheel

    def context_path(self) -> str:
        return f"{CONTEXT_DIR}/{self.wheel}"


def load_installer(root: Path) -> Installer:
    """The installer pin of the project at ``root``, shape-checked (exit 3 when malformed)."""
    path = root / PIN
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        msg = f"{path} is missing: it pins the installer every build runs; restore it from git"
        raise ConfigurationError(msg) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        msg = f"{path} cannot be read ({exc}); restore it from git"
        raise ConfigurationError(msg) from None
    uv = data.get("uv")
    if not isinstance(uv, dict) or set(uv) != {"version", "wheel", "sha256", "binary"} or not all(
            isinstance(v, str) for v in uv.values()):
        msg = f"{path}: [uv] must hold exactly version, wheel, sha256 and binary, as strings"
        raise ConfigurationError(msg)
    installer = Installer(**uv)
    wheel, member = _WHEEL.fullmatch(installer.wheel), _MEMBER.fullmatch(installer.binary)
    problems = [
        what for what, ok in (
            ("version", _VERSION.fullmatch(installer.version)),
            ("sha256 (64 lowercase hex digits)", _SHA256.fullmatch(installer.sha256)),
            ("wheel (uv-VERSION-py3-none-PLATFORM.whl)",
             wheel and wheel["version"] == installer.version),
            ("binary (uv-VERSION.data/scripts/uv)",
             member and member["version"] == installer.version),
        ) if not ok
    ]
    if problems:
        msg = (f"{path}: [uv] {problems[0]} is malformed or names another version than "
               f"{installer.version!r}")
        raise ConfigurationError(msg)
    return installer


def require_installer(installer: Installer, root: Path) -> None:
    """Refuse a build whose installer wheel is missing or not the pinned file (exit 4)."""
    path = installer.path(root)
    if not path.is_file():
        msg = (f"{TOOLS_DIR / installer.wheel} (the pinned installer) is missing: run "
               "'stackpin wheels fetch CELL' on a connected host")
        raise ValidationError(msg)
    actual = sha256_file(path)
    if actual != installer.sha256:
        msg = (f"{TOOLS_DIR / installer.wheel}: sha256 {actual}, {PIN} pins "
               f"{installer.sha256}; delete it and run 'stackpin wheels fetch CELL'")
        raise ValidationError(msg)


def pip_download_argv(installer: Installer, *, dest: Path, requirements: Path,
                      python: str = sys.executable) -> list[str]:
    """pip download of exactly the pinned wheel: its own platform, hash-checked, no deps."""
    platform = installer.wheel.removesuffix(".whl").split("-", 4)[4].split(".")[0]
    return [python, "-m", "pip", "download", "--disable-pip-version-check",
            "--only-binary=:all:", "--platform", platform, "--no-deps", "--require-hashes",
            "--dest", str(dest), "-r", str(requirements)]


def fetch_installer(installer: Installer, root: Path, *, runner: Runner = subprocess_runner,
                    on_line: LineSink = lambda _line: None) -> bool:
    """Download the pinned wheel into wheels/tools/ unless it is there already; True when
    it was downloaded. A file there that is not the pinned one is replaced."""
    path = installer.path(root)
    if path.is_file() and sha256_file(path) == installer.sha256:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"uv=={installer.version} --hash=sha256:{installer.sha256}\n",
                                encoding="utf-8")
        downloads = Path(tmp) / "dl"
        argv = pip_download_argv(installer, dest=downloads, requirements=requirements)
        on_line(f"pip download uv {installer.version} (the pinned installer)")
        got = downloads / installer.wheel
        if runner(argv, on_line) != 0 or not got.is_file():
            msg = (f"pip download of the pinned installer {installer.wheel} failed; the "
                   "output above says why (check the index and pinning/tools/installer.toml)")
            raise HostEnvironmentError(msg)
        if sha256_file(got) != installer.sha256:
            msg = f"the downloaded {installer.wheel} does not hash to its pin in {PIN}"
            raise ValidationError(msg)
        got.replace(path)
    return True


# docs/matrix.md's section on this pin (`stackpin matrix docs` prints it after the matrix guide).
GUIDE = """\
## Build tools: `pinning/tools/installer.toml`

The installer every build runs, uv, is pinned in its own file, not in any cell's lock:

```toml
[uv]
version = "0.13.8"
wheel = "uv-0.13.8-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
sha256 = "e18a57b8…"                      # of the wheel on the index
binary = "uv-0.13.8.data/scripts/uv"      # the member the build runs
```

Why apart: a cell's lock digest names exactly what its image installs, and device evidence
is tied to it (the CUDA lock's H200 runs); a tool bump must not move any lock, so every
shipped lock stays byte-identical when uv changes. The file is not a matrix
(`pinning/*.toml` are; this one is a folder down) and is shape-checked when read (exactly
these four strings, a 64-hex sha256, a wheel and member of the pinned version): exit 3
otherwise.

- `stackpin wheels fetch CELL` downloads the wheel into `wheels/tools/` with `pip download
  --no-deps --require-hashes --only-binary=:all:` for its own platform tag, once.
- `stackpin build` refuses a missing wheel or one whose sha256 differs (exit 4, before
  Docker starts), stages it into the context as `tools/<wheel>`, and the Dockerfile checks
  the sha256 again (`sha256sum --check`) before it unpacks the binary. BuildKit builds it in
  a `tools` stage that is only bind-mounted into the install steps; the classic builder
  unpacks it into the install stage's `/tmp`, which the final stage never copies. Either
  way no part of uv is in the image.
- Each layer is installed with `uv pip install --python /opt/stackpin/venv/bin/python
  --offline --no-config --no-cache --no-index --no-deps --require-hashes --no-build`: the
  same rules as pip before it (exact hashes, no resolution, no index, no sdist), and the
  build runs network-off. The guard still runs `pip check` (the venv keeps its own pip),
  and each install step compiles the bytecode of what it installed (`templates/compile.py`,
  from the wheels' RECORDs), unchecked-hash, so no layer carries another's `.pyc`.
- A `--with-wheels` bundle carries the pin and the wheel, so a site rebuilds offline with
  the same installer.

To bump uv: set the four values from the index (`pip download uv==X --no-deps
--only-binary=:all: --platform manylinux_2_17_x86_64` and `sha256sum` of the file), run
`stackpin wheels fetch CELL`, rebuild. Image IDs change (the Dockerfile names the wheel's
sha256); no lock does.
"""
