"""A test image a killed run left is what keeps its parent, and the next session removes it.

CI met this: a run of a commit was cut short after the fault images (children of the CPU
image) were built; the next run of that commit built the same CPU image ID, and removing its
tags only untagged it, so the bundle round trip found it still present and every later test
found it untagged. Here the same shape with one-file images: a parent made by `docker
import`, a child built on it by the classic builder, the child tagged as a test tags.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from tests.integration.leftovers import remove_test_images

from stackpin.engine.docker_api import DockerEngine

pytestmark = pytest.mark.docker


def _rootfs() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("marker"), io.BytesIO(b""))
    return buffer.getvalue()


def _docker(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", *args], input=stdin, capture_output=True, check=False,
                          env={**os.environ, "DOCKER_BUILDKIT": "0"})


def test_a_left_child_keeps_its_parent_until_the_leftovers_go(docker_engine: DockerEngine,
                                                              tmp_path: Path) -> None:
    token = uuid.uuid4().hex[:8]
    parent_ref = f"stackpin-leftover-parent-{token}:1"
    theirs_ref = f"stackpin-leftover-theirs-{token}:1"
    prefix = f"stackpin-test-leftover-{token}"  # this test's own, not the session's images
    child_ref = f"{prefix}/fault:{token}"
    parent = _docker("import", "-", parent_ref, stdin=_rootfs()).stdout.decode().strip()
    theirs = _docker("import", "-", theirs_ref, stdin=_rootfs()).stdout.decode().strip()
    (tmp_path / "Dockerfile").write_text(f"FROM {parent_ref}\nCOPY Dockerfile /child\n")
    built = _docker("build", "-q", "-t", child_ref, str(tmp_path))
    container = f"stackpin-leftover-{token}"
    try:
        assert built.returncode == 0, built.stderr.decode()
        # A killed run's container of the test image goes with it.
        made = _docker("create", "--name", container, child_ref, "/marker")
        assert made.returncode == 0, made.stderr.decode()
        # What CI met: with a child left, removing the parent's only tag just untags it.
        assert _docker("rmi", parent_ref).returncode == 0
        info = docker_engine.image_info(parent)
        assert info is not None and info.tags == ()
        assert _docker("tag", parent, parent_ref).returncode == 0

        assert remove_test_images(prefix) == [child_ref]
        assert docker_engine.image_info(child_ref) is None
        assert _docker("container", "inspect", container).returncode != 0
        assert docker_engine.image_info(parent_ref) is not None  # tagged: only its child went
        assert docker_engine.image_info(theirs_ref) is not None  # not a test's: it stays
        done = _docker("rmi", parent_ref)
        assert done.returncode == 0, done.stderr.decode()
        assert docker_engine.image_info(parent) is None  # now removing its tag removes it
    finally:
        _docker("rm", "--force", container)
        for ref in (child_ref, parent, theirs):
            _docker("rmi", "--force", ref)
