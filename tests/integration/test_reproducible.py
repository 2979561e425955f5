"""Reproducible images on the real daemon: the same cell gives the same image ID from
another directory, time zone, umask and hostname, and an injected nondeterminism is
caught by `stackpin rebuild --check` and named by its path.

CI cost (2 cores): one truly --no-cache build of the CPU default (B: `stackpin rebuild
--check`, ~4-7 min plus normalisation). Build A reuses the layers the session's
`cpu_image` build left in the cache (on a clean CI machine those come from a cold build
in this session). The injection test builds the engine matrix's small cell (seconds, not
the CPU image's minutes: it cost 2.5 min of CI's 90 on the CPU image), and
`rebuild --check --use-cache` re-runs just the injected step and the labels after it.
Both tests work in snapshot copies of the checkout, so edits made to the checkout while
they run cannot make the two builds differ; the image tags they move are put back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, ROOT, checkout_copy
from tests.integration.small_cell import MATRIX_CELL, _rewrite

from stackpin.engine.docker_api import DockerEngine
from stackpin.lock import read_lock
from stackpin.normalize import SDE_LABEL
from stackpin.render import DOCKERFILES

pytestmark = pytest.mark.docker

# A token unique to each run keeps the step out of the layer cache of earlier runs on the
# same daemon: a cached `date` layer from a previous run would make both builds agree.
INJECTED = f"RUN : {uuid.uuid4().hex} && date +%s%N > /opt/stackpin/built-at"
ANCHOR = '{% include "fragments/labels.j2" %}'  # the small cell's metadata steps


def stackpin(copy: Path, *args: str, env: dict[str, str] | None = None,
             umask: str = "022", hostname: str = "") -> subprocess.CompletedProcess[str]:
    """The CLI run from ``copy`` with a given umask and, where we may, its own hostname."""
    argv = [sys.executable, "-m", "stackpin.cli.main", *args]
    script = f'umask {umask}; exec "$@"'
    if hostname and os.geteuid() == 0 and shutil.which("unshare"):
        # A UTS namespace of its own: the CLI (and the tar it writes) sees another host.
        argv = ["unshare", "--uts", "sh", "-c", f"hostname {hostname}; {script}", "sh", *argv]
    else:
        argv = ["sh", "-c", script, "sh", *argv]
    return subprocess.run(argv, cwd=copy, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, check=False)


def record_of(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    (record,) = json.loads(done.stdout)
    return dict(record)


@pytest.fixture
def tags_put_back(docker_engine: DockerEngine) -> Iterator[None]:
    """The copies build under the CPU default's own tags; give them back afterwards."""
    lock = read_lock(ROOT, CPU_CELL)
    assert lock is not None
    tags = (f"stackpin/{CPU_CELL}:stable-{lock.digest[:12]}", f"stackpin/{CPU_CELL}:stable")
    before = {t: info.id for t in tags if (info := docker_engine.image_info(t)) is not None}
    try:
        yield
    finally:
        for tag, image_id in before.items():
            docker_engine.tag(image_id, tag)


def test_no_cache_rebuild_elsewhere_gives_the_same_image_id(
    cpu_image, cpu_project: Path, docker_engine: DockerEngine, tmp_path: Path,
    tags_put_back: None,
):
    """`rebuild --check` (a --no-cache build) from another directory, TZ, umask and host."""
    first = checkout_copy(tmp_path / "checkout-a", wheels_from=cpu_project)
    second = tmp_path / "elsewhere" / "deeper" / "checkout-b"
    shutil.copytree(first, second, symlinks=True)
    a = record_of(stackpin(first, "build", CPU_CELL, "--json"))
    info = docker_engine.image_info(str(a["image_id"]))
    assert info is not None
    assert info.created == "2025-01-01T00:00:00Z"
    assert info.labels[SDE_LABEL] == "1735689600"
    for label in ("io.stackpin.lock-digest", "io.stackpin.cell-json", "io.stackpin.version",
                  "io.stackpin.source-commit", "org.opencontainers.image.revision"):
        assert info.labels[label]
    done = stackpin(
        second, "rebuild", "--check", CPU_CELL, "--variant", "stable",
        "--image", str(a["image_id"]), "--json",
        env={"TZ": "Pacific/Chatham", "HOSTNAME": "repro-b", "LANG": "C"},
        umask="077", hostname="repro-b",
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout)
    (only,) = report["reports"]
    assert report["pass"] is True
    assert only["existing"] == only["rebuilt"] == a["image_id"]
    log = (second / "build" / "logs" / f"{CPU_CELL}-stable-rebuild.log").read_text()
    assert "Step 1/" in log
    assert "Using cache" not in log  # B ran every step
    leftovers = [t for i in docker_engine.list_images(f"io.stackpin.cell={CPU_CELL}")
                 for t in i.tags if ":rebuild-check-" in t]
    assert leftovers == []


def test_injected_timestamp_is_caught_and_named(
    cpu_base: str, small_checkout: Path, docker_engine: DockerEngine, tmp_path: Path,
):
    """The injection rides on the engine matrix's small cell (same base, same classic
    builder and normalisation on the default engine, a few MB of layers): what is under
    test is that `rebuild --check` finds the one layer that differs and names its path,
    not the CPU image's content (B above proves that rebuilds the same)."""
    copy = tmp_path / "injected"
    subprocess.run(["cp", "-al", str(small_checkout), str(copy)], check=True)
    for template in DOCKERFILES.values():
        path = copy / "templates" / template
        text = path.read_text()
        assert ANCHOR in text
        _rewrite(path, text.replace(ANCHOR, INJECTED + "\n" + ANCHOR))
    built = record_of(stackpin(copy, "build", MATRIX_CELL, "--builder", "classic", "--json"))
    # Drop the builder's cache of the injected step (and the metadata steps after it),
    # so the cached rebuild below runs `date` again; earlier layers stay cached.
    assert docker_engine.remove_image(str(built["raw_image_id"]))
    try:
        # --image pins the comparison to this build: other sessions may move the tags.
        done = stackpin(copy, "rebuild", "--check", "--use-cache", MATRIX_CELL, "--json",
                        "--builder", "classic", "--variant", "stable",
                        "--image", str(built["image_id"]))
        assert done.returncode == 6, f"{done.stdout}\n{done.stderr}"
        report = json.loads(done.stdout)
        assert report["pass"] is False
        (only,) = report["reports"]
        assert only["existing"] == built["image_id"]
        (layer,) = only["layers"]
        assert "date +%s%N" in layer["created_by"]
        by_path = {p["path"]: p["kinds"] for p in layer["paths"]}
        assert by_path == {"opt/stackpin/built-at": ["content"]}
        # The one-line error names the path too (the text report is tested in unit tests).
        assert "not reproducible" in done.stderr
        assert "/opt/stackpin/built-at" in done.stderr
    finally:  # this build's image only: the matrix may hold the cell's on other engines
        docker_engine.remove_image(str(built["image_id"]), force=True)
    leftovers = [i for i in docker_engine.list_images(f"io.stackpin.cell={MATRIX_CELL}")
                 if any(":rebuild-check-" in t for t in i.tags)]
    assert leftovers == []
