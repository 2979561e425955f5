"""Per-layer bytecode (templates/compile.py): a step compiles exactly what it installed.

What matters for delta bundles and rebuilds (issue 25): no pyc of a lower layer is written
again (it would be copied up into this layer), every module this layer installed gets an
unchecked-hash pyc (no timestamp: the same bytes on every build), and a requirement the
step did not install fails the step by name instead of leaving modules uncompiled.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

COMPILE = ROOT / "templates" / "compile.py"


def _dist(site: Path, name: str, version: str, modules: dict[str, str], *, record: bool = True
          ) -> None:
    """An installed distribution as an installer leaves it: its files and its dist-info."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"{info.name}/METADATA,,"]
    for rel, text in modules.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
        lines.append(f"{rel},,")
    if record:
        (info / "RECORD").write_text("\n".join(lines) + "\n")


def _run(requirements: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(COMPILE), str(requirements), str(site)],
                          capture_output=True, text=True, check=False)


def _pycs(site: Path) -> dict[str, bytes]:
    return {p.relative_to(site).as_posix(): p.read_bytes() for p in sorted(site.rglob("*.pyc"))}


def test_only_the_layers_own_modules_are_compiled_unchecked(tmp_path: Path):
    site = tmp_path / "site"
    _dist(site, "lower", "1.0", {"lower/__init__.py": "A = 1\n"})
    newer = "def f[T](a): pass\n" if sys.version_info < (3, 12) else "def f(:\n"
    _dist(site, "upper-pkg", "2.0", {"upper/__init__.py": "B = 2\n", "upper/future.py": newer,
                                     "upper/data.txt": "not python\n"})
    req = tmp_path / "requirements.txt"
    req.write_text("# layer 'pure'\nupper_pkg==2.0 --hash=sha256:" + "0" * 64 + "\n")
    result = _run(req, site)
    assert result.returncode == 0, result.stderr
    assert "1 modules of 1 distributions, 1 skipped" in result.stdout
    pycs = _pycs(site)
    assert list(pycs) == [f"upper/__pycache__/__init__.{sys.implementation.cache_tag}.pyc"]
    flags = int.from_bytes(next(iter(pycs.values()))[4:8], "little")
    assert flags == 0b01, "hash-based, unchecked (PEP 552)"


def test_a_lower_layers_pycs_are_never_rewritten(tmp_path: Path):
    site = tmp_path / "site"
    _dist(site, "lower", "1.0", {"lower/__init__.py": "A = 1\n"})
    _dist(site, "upper", "2.0", {"upper/__init__.py": "B = 2\n"})
    (tmp_path / "lower.txt").write_text("lower==1.0\n")
    (tmp_path / "upper.txt").write_text("upper==2.0\n")
    assert _run(tmp_path / "lower.txt", site).returncode == 0
    lower_pyc = next((site / "lower" / "__pycache__").glob("*.pyc"))
    before = lower_pyc.stat().st_mtime_ns
    lower_pyc.write_bytes(b"marker")  # any rewrite would replace it
    assert _run(tmp_path / "upper.txt", site).returncode == 0
    assert lower_pyc.read_bytes() == b"marker"
    assert lower_pyc.stat().st_mtime_ns >= before


def test_the_same_bytes_on_every_run_and_any_number_of_workers(tmp_path: Path):
    site = tmp_path / "site"  # one path: a pyc names its source file's path
    _dist(site, "pkg", "1.0", {f"pkg/m{i}.py": f"X = {i}\n" for i in range(40)})
    (tmp_path / "req.txt").write_text("pkg==1.0\n")
    assert _run(tmp_path / "req.txt", site).returncode == 0  # the step's workers (os.cpu_count)
    first = _pycs(site)
    for pyc in site.rglob("*.pyc"):
        pyc.unlink()
    sys.path.insert(0, str(COMPILE.parent))
    try:
        import compile as layer_compile  # templates/compile.py, standard library only
    finally:
        sys.path.pop(0)
    files = sorted(str(p) for p in site.rglob("*.py"))
    assert layer_compile.compile_files(files, workers=1) == []
    assert _pycs(site) == first and len(first) == 40


def test_a_requirement_not_installed_or_without_record_fails_by_name(tmp_path: Path):
    site = tmp_path / "site"
    _dist(site, "norecord", "1.0", {"norecord/__init__.py": "\n"}, record=False)
    (tmp_path / "req.txt").write_text("missing==3.1\nnorecord==1.0\n")
    result = _run(tmp_path / "req.txt", site)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"stackpin compile: missing 3.1 is not installed in {site.resolve()}",
        "stackpin compile: norecord 1.0 has no RECORD: cannot tell its files",
    ]
    assert _pycs(site) == {}, "nothing compiled when the layer is not what it should be"


def test_usage(tmp_path: Path):
    result = subprocess.run([sys.executable, str(COMPILE)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 2 and result.stderr.startswith("usage: compile.py")
