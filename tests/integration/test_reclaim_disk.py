"""scripts/reclaim-disk.sh gives back stackpin's leftovers and nothing else.

On the real default engine: a dangling image with stackpin's labels goes; a tagged one with
the same labels stays, and so does a dangling image that is not stackpin's (somebody
else's work on a shared engine). The matrix engines are kept out of it (their sockets are
pointed at an empty folder), since pruning them would take the session's loaded bases.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from tests.conftest import ROOT

from stackpin.engine.docker_api import DockerEngine

pytestmark = pytest.mark.docker

STACKPIN_LABEL = "io.stackpin.bootstrap-digest"


def _empty_rootfs() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("marker"), io.BytesIO(b""))
    return buffer.getvalue()


def _import(reference: str, label: str) -> str:
    """A one-file image made with `docker import` (no base to pull); returns its ID."""
    done = subprocess.run(
        ["docker", "import", "--change", f"LABEL {label}", "-", reference],
        input=_empty_rootfs(), capture_output=True, check=True,
    )
    return done.stdout.decode().strip()


def _reclaim(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STACKPIN_ENGINES_RUN": str(tmp_path / "no-engines"),
           "TMPDIR": str(tmp_path / "tmp")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "reclaim-disk.sh"), *args],
                          capture_output=True, text=True, env=env, check=False)


def test_only_stackpin_dangling_images_are_removed(docker_engine: DockerEngine, tmp_path: Path):
    name = f"stackpin-reclaim-test-{uuid.uuid4().hex[:8]}"
    ours_old = _import(f"{name}:ours", f"{STACKPIN_LABEL}=old-{name}")
    ours_tagged = _import(f"{name}:ours", f"{STACKPIN_LABEL}=new-{name}")  # old one dangles
    theirs_old = _import(f"{name}:theirs", f"org.example.owner=old-{name}")
    theirs_tagged = _import(f"{name}:theirs", f"org.example.owner=new-{name}")
    try:
        done = _reclaim(tmp_path, "--keep-test-temp")
        assert done.returncode == 0, done.stderr
        assert "GiB free" in done.stdout
        assert docker_engine.image_info(ours_old) is None
        for kept in (ours_tagged, theirs_old, theirs_tagged):
            assert docker_engine.image_info(kept) is not None, kept
    finally:
        for image in (ours_old, ours_tagged, theirs_old, theirs_tagged):
            docker_engine.remove_image(image, force=True)


def test_old_test_folders_go_unless_kept(docker_engine: DockerEngine, tmp_path: Path):
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    stale = tmp_path / "tmp" / f"pytest-of-{user}" / "pytest-1" / "bundle.tar"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x" * 1024)
    assert _reclaim(tmp_path, "--keep-test-temp").returncode == 0
    assert stale.exists()
    assert _reclaim(tmp_path).returncode == 0
    assert not stale.parent.parent.exists()


def test_too_little_free_disk_is_exit_8_with_the_way_out(docker_engine: DockerEngine,
                                                         tmp_path: Path):
    done = _reclaim(tmp_path, "--keep-test-temp", "--need", str(1 << 20))  # a pebibyte
    assert done.returncode == 8
    last = done.stdout.strip().splitlines()[-1]
    assert "need 1048576 GiB free" in last and "docker image ls" in last


@pytest.mark.parametrize("args", [("--need", "ten"), ("--need",), ("--bogus",), ("--need", "-1"),
                                  ("--need", "99999999999999999999")])
def test_bad_arguments_are_exit_2_and_change_nothing(docker_engine: DockerEngine,
                                                     tmp_path: Path, args: tuple[str, ...]):
    name = f"stackpin-reclaim-test-{uuid.uuid4().hex[:8]}"
    dangling = _import(f"{name}:ours", f"{STACKPIN_LABEL}=old-{name}")
    tagged = _import(f"{name}:ours", f"{STACKPIN_LABEL}=new-{name}")
    try:
        done = _reclaim(tmp_path, *args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert docker_engine.image_info(dangling) is not None  # refused before any prune
    finally:
        for image in (dangling, tagged):
            docker_engine.remove_image(image, force=True)


def _recording_docker(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """PATH with a `docker` first that logs every call and passes it to the real one, except
    `builder prune -af` (the whole build cache of the session's engine: logged, not run)."""
    shims, log = tmp_path / "shims", tmp_path / "docker-calls"
    shims.mkdir()
    real = subprocess.run(["bash", "-c", "command -v docker"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (shims / "docker").write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$*" >> {log}\n'
        '[ "$*" = "builder prune -af" ] && exit 0\n'
        f'exec {real} "$@"\n')
    (shims / "docker").chmod(0o755)
    return {"PATH": f"{shims}:{os.environ['PATH']}"}, log


def test_or_prune_cache_gives_back_the_build_cache_only_when_the_need_is_not_met(
        docker_engine: DockerEngine, tmp_path: Path):
    path, log = _recording_docker(tmp_path)
    env = {**os.environ, **path, "STACKPIN_ENGINES_RUN": str(tmp_path / "no-engines"),
           "TMPDIR": str(tmp_path / "tmp")}
    script = str(ROOT / "scripts" / "reclaim-disk.sh")
    met = subprocess.run(["bash", script, "--keep-test-temp", "--need", "0", "--or-prune-cache"],
                         capture_output=True, text=True, env=env, check=False)
    assert met.returncode == 0, met.stdout + met.stderr
    assert "builder prune -af" not in log.read_text().splitlines()
    unmet = subprocess.run(["bash", script, "--keep-test-temp", "--need", str(1 << 20),
                            "--or-prune-cache"], capture_output=True, text=True, env=env,
                           check=False)
    assert unmet.returncode == 8, unmet.stdout + unmet.stderr
    assert "giving back the default engine's build cache too" in unmet.stdout
    assert "builder prune -af" in log.read_text().splitlines()
    # Without the flag the cache is never touched, however little is free.
    log.write_text("")
    bare = subprocess.run(["bash", script, "--keep-test-temp", "--need", str(1 << 20)],
                          capture_output=True, text=True, env=env, check=False)
    assert bare.returncode == 8
    calls = log.read_text().splitlines()
    assert calls and "builder prune -af" not in calls
