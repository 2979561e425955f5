"""The installer pin (pinning/tools/installer.toml, stackpin.tools): shape-checked, kept out
of every cell's lock, fetched hash-checked, and a build refuses a missing or changed wheel."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.conftest import ROOT

from stackpin import tools
from stackpin.context import read_sources
from stackpin.errors import ConfigurationError, HostEnvironmentError, ValidationError
from stackpin.tools import Installer, fetch_installer, load_installer, require_installer

WHEEL_BYTES = b"PK\x05\x06" + b"\0" * 18  # an empty zip: stands in for the wheel's bytes


def _project(tmp_path: Path, **changes: str) -> Path:
    (tmp_path / "pinning" / "tools").mkdir(parents=True)
    pin = (ROOT / tools.PIN).read_text(encoding="utf-8")
    for key, value in changes.items():
        old = next(line for line in pin.splitlines() if line.startswith(f"{key} = "))
        pin = pin.replace(old, f"{key} = {value}")
    (tmp_path / tools.PIN).write_text(pin, encoding="utf-8")
    return tmp_path


def test_the_shipped_pin_is_well_formed_and_named_in_no_lock():
    installer = load_installer(ROOT)
    assert installer.wheel.startswith(f"uv-{installer.version}-")
    assert installer.binary == f"uv-{installer.version}.data/scripts/uv"
    for lock in (ROOT / "pinning" / "locks").glob("*.lock"):
        text = lock.read_text(encoding="utf-8")
        assert installer.sha256 not in text and installer.wheel not in text, lock.name


@pytest.mark.parametrize(("key", "value", "what"), [
    ("sha256", '"E18A"', "sha256"),
    ("wheel", '"../../etc/uv-0.13.8-py3-none-any.whl"', "wheel"),
    ("wheel", '"uv-0.13.7-py3-none-manylinux_2_17_x86_64.whl"', "wheel"),
    ("binary", '"uv-0.13.8.data/scripts/../../x"', "binary"),
    ("version", '"0.13.8 --index-url http://x"', "version"),
])
def test_a_malformed_pin_is_a_one_line_configuration_error(tmp_path, key, value, what):
    root = _project(tmp_path, **{key: value})
    with pytest.raises(ConfigurationError, match=what) as caught:
        load_installer(root)
    assert "\n" not in str(caught.value)


def test_extra_or_missing_keys_are_refused(tmp_path):
    root = _project(tmp_path)
    (root / tools.PIN).write_text((root / tools.PIN).read_text() + 'extra = "x"\n')
    with pytest.raises(ConfigurationError, match="exactly version, wheel, sha256 and binary"):
        load_installer(root)
    (root / tools.PIN).unlink()
    with pytest.raises(ConfigurationError, match="is missing"):
        load_installer(root)


def _installer(data: bytes = WHEEL_BYTES) -> Installer:
    pinned = load_installer(ROOT)
    return Installer(version=pinned.version, wheel=pinned.wheel, binary=pinned.binary,
                     sha256=hashlib.sha256(data).hexdigest())


def test_a_build_refuses_a_missing_or_changed_wheel(tmp_path):
    installer = _installer()
    with pytest.raises(ValidationError, match="is missing: run 'stackpin wheels fetch CELL'"):
        require_installer(installer, tmp_path)
    installer.path(tmp_path).parent.mkdir(parents=True)
    installer.path(tmp_path).write_bytes(WHEEL_BYTES[:-1] + b"\1")  # one byte flipped
    with pytest.raises(ValidationError, match=f"pins {installer.sha256}"):
        require_installer(installer, tmp_path)
    installer.path(tmp_path).write_bytes(WHEEL_BYTES)
    require_installer(installer, tmp_path)


def _fake_pip(payload: bytes, calls: list[list[str]]):
    def runner(argv: list[str], on_line) -> int:
        calls.append(argv)
        dest = Path(argv[argv.index("--dest") + 1])
        dest.mkdir(parents=True, exist_ok=True)
        name = next(p for p in argv if p.endswith("requirements.txt"))
        assert Path(name).read_text().startswith("uv==")
        (dest / _installer().wheel).write_bytes(payload)
        return 0
    return runner


def test_fetch_downloads_exactly_the_pin_hash_checked_and_only_once(tmp_path):
    installer, calls = _installer(), []
    assert fetch_installer(installer, tmp_path, runner=_fake_pip(WHEEL_BYTES, calls)) is True
    argv = calls[0]
    assert {"--no-deps", "--require-hashes", "--only-binary=:all:"} <= set(argv)
    assert argv[argv.index("--platform") + 1] == "manylinux_2_17_x86_64"
    assert installer.path(tmp_path).read_bytes() == WHEEL_BYTES
    assert fetch_installer(installer, tmp_path, runner=_fake_pip(WHEEL_BYTES, calls)) is False
    assert len(calls) == 1
    assert [p.name for p in installer.path(tmp_path).parent.iterdir()] == [installer.wheel]


def test_fetch_refuses_bytes_that_are_not_the_pin_and_keeps_nothing(tmp_path):
    installer = _installer()
    with pytest.raises(ValidationError, match="does not hash to its pin"):
        fetch_installer(installer, tmp_path, runner=_fake_pip(b"other bytes", []))
    assert list(installer.path(tmp_path).parent.iterdir()) == []


def test_a_failed_download_is_a_host_error(tmp_path):
    with pytest.raises(HostEnvironmentError, match="pip download of the pinned installer"):
        fetch_installer(_installer(), tmp_path, runner=lambda argv, on_line: 1)


def test_the_dockerfile_checks_the_wheel_then_unpacks_its_binary_executable(tmp_path):
    """fragments/installer-unpack.j2, as rendered, run by bash: a wheel holding the pinned
    member (a script standing in for uv's binary) is checked and unpacked executable; one
    flipped byte stops it before anything is unpacked."""
    import zipfile

    from stackpin.render import render_template

    pinned = load_installer(ROOT)
    tools_dir = tmp_path / "tmp" / "tools"
    tools_dir.mkdir(parents=True)
    wheel = tools_dir / pinned.wheel
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(pinned.binary, f"#!/bin/sh\necho uv {pinned.version}\n")
    installer = Installer(version=pinned.version, wheel=pinned.wheel, binary=pinned.binary,
                          sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    command = render_template(read_sources(ROOT / "templates"), "fragments/installer-unpack.j2",
                              {"installer": installer, "uv_dir": str(tmp_path / "uv")})
    command = command.replace("/tmp/tools", str(tools_dir))

    def unpack() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True,
                              text=True, check=False)

    done = unpack()
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([str(tmp_path / "uv" / "uv")], capture_output=True, text=True,
                         check=True)
    assert ran.stdout == f"uv {pinned.version}\n"
    shutil.rmtree(tmp_path / "uv")
    data = bytearray(wheel.read_bytes())
    data[40] ^= 1
    wheel.write_bytes(bytes(data))
    done = unpack()
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr
    assert not (tmp_path / "uv").exists()
