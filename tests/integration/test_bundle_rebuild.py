"""Seed 000's source-build route on the real daemon: a ``--with-wheels`` bundle, copied to a
folder with no checkout, rebuilds the CPU image offline to the same image ID.

"Same identity" is the image ID: the build is normalised, so the ID depends only on what
is installed and on the image config, whose labels include the source commit; the bundle
records that commit (SOURCE_COMMIT) because the site folder has no git. The rebuild shares
the session's build: the classic builder reuses layers only when each step and every
copied file is identical, so the bundle supplying an input that differs in one byte (a
template, verify/, a wheel, the lock) would show as another ID. `rebuild --check` (issue 7)
covers the --no-cache rebuild.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.conftest import CPU_CELL

from stackpin.engine import Engine

pytestmark = pytest.mark.docker

STACKPIN = [sys.executable, "-m", "stackpin.cli.main"]


def _stackpin(*args: str, cwd, env=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STACKPIN, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=3600, env={**os.environ, **(env or {})})


def test_a_with_wheels_bundle_rebuilds_the_same_image_offline_without_a_checkout(
        cpu_image, cpu_project, docker_engine: Engine, tmp_path_factory):
    work = tmp_path_factory.mktemp("offline-site")
    site = work / "bundle"
    keys = work / "keys"
    done = _stackpin("keys", "generate", "-o", str(keys), cwd=work)
    assert done.returncode == 0, done.stderr
    done = _stackpin("bundle", "export", CPU_CELL, "-o", str(site), "--with-wheels", "--json",
                     "--sign-key", str(keys / "stackpin.key"), cwd=cpu_project)
    assert done.returncode == 0, done.stderr
    (image,) = json.loads((site / "manifest.json").read_bytes())["images"]
    assert image["id"] == cpu_image["image_id"]
    done = _stackpin("bundle", "verify", str(site), "--pubkey", str(keys / "stackpin.pub"),
                     cwd=work)
    assert done.returncode == 0, done.stderr
    # No checkout: not a git work tree, and the bundle folder is the only project root.
    no_git = {"GIT_CEILING_DIRECTORIES": str(work)}
    assert subprocess.run(["git", "-C", str(site), "rev-parse"], capture_output=True,
                          env={**os.environ, **no_git}).returncode != 0
    assert not [p for p in site.parents if (p / "pinning").is_dir()]

    tag = image["tags"][0]
    try:
        done = _stackpin("build", CPU_CELL, "--offline", "--json", cwd=site, env=no_git)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        (record,) = json.loads(done.stdout)
        assert record["image_id"] == image["id"], "the site rebuilt another image"
        info = docker_engine.image_info(tag)
        assert info is not None
        assert info.id == image["id"]
        assert info.labels["io.stackpin.source-commit"] == (
            site / "SOURCE_COMMIT").read_text().strip()
    finally:  # a failed rebuild moved the shared tags: give them back to the session's image
        for name in image["tags"]:
            moved = docker_engine.image_info(name)
            if moved is None or moved.id != image["id"]:
                docker_engine.tag(image["id"], name)
