"""Issue 5, item 5 on the real daemon: export signed, remove, preflight, load, verify,
start, stop; then one flipped byte is refused by load.sh and stackpin with nothing loaded.

The images are removed during the test and always reloaded from the good bundle in
``finally``, so tests that run after this one still find them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, ROOT
from tests.integration.loopback import answering, outside_addresses

from stackpin.engine.docker_api import DockerEngine

sys.path.insert(0, str(ROOT / "verify"))
from stackpin_verify.studio_api import Studio

pytestmark = pytest.mark.docker

STACKPIN = [sys.executable, "-m", "stackpin.cli.main"]
# stackpin.cli.progress.ByteProgress's plain line: "verify: 12/700 MiB (2%), 50.0 MiB/s, ..."
# (the rate and ETA only once they mean something, an estimated total as "~700").
PROGRESS_LINE = re.compile(
    r"(verify|load): \d+/~?\d+ MiB \(\d+%\)(, [0-9.]+ MiB/s(, ETA ~?\d+ s)?)?( in \d+ s)?")


def _stackpin(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # Export runs in the session's checkout copy (its build records); the other verbs
    # write nothing into a project.
    return subprocess.run([*STACKPIN, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=3600)


def _script(bundle: Path, name: str, *args: str, env: dict[str, str] | None = None,
            timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(bundle / "bin" / name), *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _port() -> int:
    """18888 (the stable default) when free, else any free loopback port."""
    for candidate in (18888, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    msg = "no free loopback port"
    raise AssertionError(msg)


def _remove(engine: DockerEngine, image_id: str) -> None:
    info = engine.image_info(image_id)
    for tag in info.tags if info else ():
        engine.remove_image(tag)
    assert engine.image_info(image_id) is None, f"{image_id} is still present (used elsewhere?)"


def test_round_trip_on_the_real_daemon(signed_cpu_bundle, cpu_image, tiny_models: Path,
                                      docker_engine: DockerEngine):
    bundle, pubkey = signed_cpu_bundle
    manifest = json.loads((bundle / "manifest.json").read_bytes())
    (image,) = manifest["images"]
    assert image["id"] == cpu_image["image_id"]
    port = _port()
    try:
        _remove(docker_engine, image["id"])

        trusted = {"STACKPIN_PUBKEY": str(pubkey)}  # the site's key, as an operator sets it
        done = _script(bundle, "preflight.sh", env=trusted)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "FAIL" not in done.stdout

        done = _script(bundle, "load.sh", "--pubkey", str(pubkey))
        assert done.returncode == 0, done.stdout + done.stderr
        loaded = docker_engine.image_info(image["id"])
        assert loaded is not None
        assert set(image["tags"]) <= set(loaded.tags)

        done = _script(bundle, "verify.sh", env=trusted)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        report = json.loads((bundle.parent / "site.reports" / "stable" / "report.json").read_text())
        assert report["summary"]["required_failed"] == 0
        # L8 inside the loaded image: Studio started, logged in, chatted (not skipped).
        statuses = {c["name"]: c["status"] for c in report["checks"]}
        assert [statuses.get(f"L8.service.{step}") for step in ("start", "login", "chat")] \
            == ["pass"] * 3
        assert (bundle.parent / "site.reports" / "stable" / "report.xml").is_file()

        site = {**trusted, "STACKPIN_PORT": str(port), "STACKPIN_MODELS_DIR": str(tiny_models)}
        done = _script(bundle, "start.sh", "stable", env=site)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"serves http://127.0.0.1:{port}/" in done.stdout
        password = bundle.parent / "site.state" / "stable" / "studio" / "auth" / ".bootstrap_password"
        assert f"password in {password}" in done.stdout
        state = _inspect("stackpin_site_stable")
        assert state["State"]["Health"]["Status"] == "healthy"
        bindings = state["HostConfig"]["PortBindings"]
        assert bindings == {"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
        assert answering(port, outside_addresses()) == []  # the probe's control: test_service_cpu
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=10) as response:
            health = json.loads(response.read())
        assert (health["status"], health["service"]) == ("healthy", "Unsloth UI Backend")

        # The scripted first use: bootstrap login, forced change, one chat with the tiny model.
        studio = Studio(f"http://127.0.0.1:{port}")
        bootstrap = password.read_text().strip()
        assert studio.login(bootstrap)["must_change_password"] is True
        studio.change_password(bootstrap, "Stackpin-site-2026")
        assert studio.load_model("/workspace/models/tiny")["status"] == "loaded"
        reply = studio.chat("/workspace/models/tiny", "hello", max_tokens=4)
        assert reply["object"] == "chat.completion"

        again = _script(bundle, "start.sh", "stable", env=site)
        assert again.returncode == 8
        assert "already running" in again.stderr

        done = _script(bundle, "stop.sh", "stable")
        assert done.returncode == 0, done.stdout + done.stderr
        assert _inspect("stackpin_site_stable") is None

        # A service that never gets healthy, and one that exits while starting: one line,
        # exit 6, the last log lines, and no container left behind.
        slow = _script(bundle, "start.sh", "stable", env={**site, "STACKPIN_START_TIMEOUT": "1"})
        assert slow.returncode == 6, slow.stdout + slow.stderr
        assert "not healthy after 1s" in slow.stderr
        assert _inspect("stackpin_site_stable") is None
        dying = _script(bundle, "start.sh", "stable", "--", "python", "-c",
                        "print('stackpin-test: giving up'); raise SystemExit(3)", env=site)
        assert dying.returncode == 6, dying.stdout + dying.stderr
        assert "exited while starting" in dying.stderr
        assert "stackpin-test: giving up" in dying.stderr
        assert _inspect("stackpin_site_stable") is None
    finally:
        subprocess.run(["docker", "rm", "-f", "stackpin_site_stable"], capture_output=True)
        if docker_engine.image_info(image["id"]) is None:
            _stackpin("bundle", "load", str(bundle), "--pubkey", str(pubkey))


def test_one_flipped_byte_is_refused_with_nothing_loaded(signed_cpu_bundle, cpu_image,
                                                         docker_engine: DockerEngine, tmp_path):
    good, pubkey = signed_cpu_bundle
    bundle = tmp_path / "tampered"
    shutil.copytree(good, bundle)
    path = bundle / "images.tar.zst"
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))
    image_id = json.loads((bundle / "manifest.json").read_bytes())["images"][0]["id"]
    try:
        _remove(docker_engine, image_id)

        done = _script(bundle, "load.sh", "--pubkey", str(pubkey))
        assert done.returncode != 0
        assert "checksum: images.tar.zst" in done.stderr
        assert docker_engine.image_info(image_id) is None

        for verb in ("verify", "load"):
            done = _stackpin("bundle", verb, str(bundle), "--pubkey", str(pubkey))
            assert done.returncode == 7, done.stderr
            # One error line, last; before it only byte-progress lines (a 700 MB bundle
            # shows them on stderr when not on a terminal, as CI is).
            *progress, error = done.stderr.strip().splitlines()
            assert "images.tar.zst does not match its sha256" in error
            assert all(PROGRESS_LINE.fullmatch(line) for line in progress), progress
            assert docker_engine.image_info(image_id) is None
    finally:
        if docker_engine.image_info(image_id) is None:
            done = _stackpin("bundle", "load", str(good), "--pubkey", str(pubkey))
            assert done.returncode == 0, done.stderr


def test_two_exports_of_the_same_images_are_byte_identical(signed_cpu_bundle, cpu_project: Path,
                                                           tmp_path):
    first, _pubkey = signed_cpu_bundle
    key = first.parent / "keys" / "stackpin.key"
    second = tmp_path / "site"
    done = _stackpin("bundle", "export", CPU_CELL, "-o", str(second), "--sign-key", str(key),
                     cwd=cpu_project)
    assert done.returncode == 0, done.stderr
    for name in ("images.tar.zst", "manifest.json", "manifest.sig", "SHA256SUMS"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def _inspect(name: str) -> dict | None:  # type: ignore[type-arg]
    done = subprocess.run(["docker", "container", "inspect", name], capture_output=True,
                          text=True)
    return json.loads(done.stdout)[0] if done.returncode == 0 else None
