"""The whole flow on each engine of the matrix, with a small image whose content does not matter.

Per engine (Docker 20.10, Docker 28 classic store, Docker 28 containerd image store; see
conftest.matrix_engine), through the CLI a user runs:
build with BuildKit (--no-cache; reproducible as built on Docker 28, either store: the
engine clamps the config, the Dockerfile's steps their layers; on 20.10 the config alone is
normalised) -> `rebuild --check` from another folder, time zone, umask and
host (a second --no-cache BuildKit build) gives the same identity -> `bundle export`
(signed) -> `bundle verify` -> the images removed, `bundle load` brings back the same ID ->
removed again, the bundle's own `bin/load.sh` loads it -> a container of it starts and runs.
The classic builder is built once per engine too (it stays the path for engines without
BuildKit).

The cell is the CPU default renamed (MATRIX_CELL, its lock rewritten to match), so its
images never touch the CPU default's tags, built from a small synthetic Dockerfile
template in a copy of the checkout: the engines, not torch, are under test here. The full
CPU image is tested on the default engine (test_build_cpu, test_reproducible, ...).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.conftest import matrix_hosts
from tests.integration.small_cell import EPOCH, MATRIX_CELL
from tests.integration.test_reproducible import stackpin
from tests.tools import need_docker_plugin

from stackpin.engine import RunRequest, SaveRequest, chunk_stream
from stackpin.engine.docker_api import DockerEngine
from stackpin.engine.save_format import read_save

pytestmark = pytest.mark.docker

def on(engine: DockerEngine) -> dict[str, str]:
    return {"DOCKER_HOST": engine.url}


def build_small(engine: DockerEngine, checkout: Path, tmp_path_factory: pytest.TempPathFactory,
                builder: str) -> dict[str, object]:
    """`stackpin build --no-cache --builder BUILDER` of MATRIX_CELL in a fresh copy."""
    if builder == "buildkit":
        # BuildKit goes through the CLI's buildx plugin (scripts/setup-buildx.sh, which
        # README command 1 runs): without it, the project's missing-tool rule.
        need_docker_plugin("buildx")
    copy = tmp_path_factory.mktemp(f"matrix-{builder}") / "checkout"
    copy.parent.mkdir(exist_ok=True)
    subprocess.run(["cp", "-al", str(checkout), str(copy)], check=True)
    done = stackpin(copy, "build", MATRIX_CELL, "--no-cache", "--builder", builder, "--json",
                    env={**on(engine), "TZ": "UTC"})
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    (record,) = json.loads(done.stdout)
    return {**record, "checkout": copy}


@pytest.fixture(scope="session")
def matrix_build(
    matrix_engine: DockerEngine, matrix_base: str, small_checkout: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, object]]:
    """The BuildKit build of MATRIX_CELL on the engine; its images removed after."""
    yield build_small(matrix_engine, small_checkout, tmp_path_factory, "buildkit")
    for info in matrix_engine.list_images(f"io.stackpin.cell={MATRIX_CELL}"):
        matrix_engine.remove_image(info.id, force=True)


def buildkit_steps(log: str) -> tuple[dict[str, str], set[str]]:
    """BuildKit's plain progress in a build log: vertex -> step text, and cached vertices."""
    steps = dict(re.findall(r"^#(\d+) (\[[^\]]*\d+/\d+\] .*)$", log, re.MULTILINE))
    return steps, set(re.findall(r"^#(\d+) CACHED$", log, re.MULTILINE))


def layer_mtimes_above_base(engine: DockerEngine, image_id: str, base: str) -> list[int]:
    """The mtime of every member of the image's own layers (those the base does not have)."""
    base_info = engine.image_info(base)
    assert base_info is not None

    def mtimes(data):  # type: ignore[no-untyped-def]
        with tarfile.open(fileobj=data, mode="r|") as tar:
            return [int(member.mtime) for member in tar]

    saved = read_save(chunk_stream(engine.save(SaveRequest(images=(image_id,)))), mtimes)
    own = [layer for layer in saved.layers_of(saved.entry_for(image_id))
           if layer.diff_id not in base_info.diff_ids]
    assert own, "the image has no layer of its own"
    return [mtime for layer in own for mtime in layer.value]


def test_the_buildkit_build_is_reproducible_as_its_engine_can(matrix_engine, matrix_base,
                                                            matrix_build):
    record = matrix_build
    info = matrix_engine.image_info(str(record["image_id"]))
    assert info is not None
    assert info.created == "2025-01-01T00:00:00Z"
    assert info.labels["io.stackpin.cell"] == MATRIX_CELL
    assert set(record["tags"]) <= set(info.tags)  # type: ignore[arg-type]
    # Built by BuildKit, not a silent fall-back to the classic builder.
    log = Path(str(record["log_path"])).read_text()
    steps, _ = buildkit_steps(log)
    assert record["builder"] == "buildkit"
    assert any(" FROM " in step for step in steps.values()) and "Step 1/" not in log
    # Docker 28 (either store): the engine clamps the config and the Dockerfile's steps
    # clamp what they wrote, so the image is reproducible as built: nothing normalised.
    # Docker 20.10's BuildKit ignores SOURCE_DATE_EPOCH: stackpin normalises its image.
    native = not matrix_engine.version().version.startswith("20.")
    assert record["timestamps"] == ("native" if native else "normalised")
    assert (record["raw_image_id"] == record["image_id"]) is native
    # On 20.10 only the config is rewritten: the layers are the build's own, clamped by
    # its steps, the mount targets laid down first (stackpin.normalize_record).
    raw = matrix_engine.image_info(str(record["raw_image_id"]))
    assert raw is not None and raw.diff_ids == info.diff_ids
    mtimes = layer_mtimes_above_base(matrix_engine, str(record["image_id"]), matrix_base)
    assert max(mtimes) <= EPOCH < os.stat(str(record["log_path"])).st_mtime


def test_images_reports_the_unpacked_size_on_every_store(matrix_engine, matrix_build):
    # Before the bundle tests replace the image with its bundled twin (raw layers).
    # The containerd store's own Size is the compressed content (gzip layers from BuildKit):
    # `stackpin images` must report what the layers take unpacked, as on the classic store.
    image_id = str(matrix_build["image_id"])

    def count(data):  # type: ignore[no-untyped-def]
        return sum(len(chunk) for chunk in iter(lambda: data.read(1 << 20), b""))

    saved = read_save(chunk_stream(matrix_engine.save(SaveRequest(images=(image_id,)))), count)
    layer_bytes = sum(layer.value for layer in saved.layers_of(saved.entry_for(image_id)))
    done = stackpin(Path(str(matrix_build["checkout"])), "images", "--json",
                    env=on(matrix_engine))
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in json.loads(done.stdout) if r["id"] == image_id]
    assert 0.9 * layer_bytes <= row["size"] <= 1.2 * layer_bytes, (row["size"], layer_bytes)


def test_the_classic_builder_still_builds_on_every_engine(matrix_engine, matrix_base,
                                                          matrix_build, small_checkout,
                                                          tmp_path_factory):
    record = build_small(matrix_engine, small_checkout, tmp_path_factory, "classic")
    try:
        log = Path(str(record["log_path"])).read_text()
        assert (record["builder"], record["timestamps"]) == ("classic", "normalised")
        assert "Step 1/" in log and not buildkit_steps(log)[0]
        info = matrix_engine.image_info(str(record["image_id"]))
        assert info is not None and info.created == "2025-01-01T00:00:00Z"
        mtimes = layer_mtimes_above_base(matrix_engine, str(record["image_id"]), matrix_base)
        assert max(mtimes) <= EPOCH
    finally:
        for image in {str(record["image_id"]), str(record["raw_image_id"])}:
            matrix_engine.remove_image(image, force=True)
        for tag in matrix_build["tags"]:  # the classic build took the BuildKit image's tags
            matrix_engine.tag(str(matrix_build["image_id"]), tag)


def test_rebuild_check_elsewhere_gives_the_same_identity(matrix_engine, matrix_build,
                                                         small_checkout, tmp_path):
    second = tmp_path / "elsewhere" / "deeper" / "checkout"
    second.parent.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(small_checkout), str(second)], check=True)

    done = stackpin(second, "rebuild", "--check", MATRIX_CELL, "--variant", "stable",
                    "--builder", "buildkit", "--image", str(matrix_build["image_id"]), "--json",
                    env={**on(matrix_engine), "TZ": "Pacific/Chatham", "LANG": "C"},
                    umask="077", hostname="matrix-b")

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout)
    (only,) = report["reports"]
    assert only["existing"] == only["rebuilt"] == matrix_build["image_id"]
    log = (second / "build" / "logs" / f"{MATRIX_CELL}-stable-rebuild.log").read_text()
    steps, cached = buildkit_steps(log)
    # A BuildKit rebuild that ran every step: only FROM is reported as CACHED.
    assert len(steps) > 2 and all(" FROM " in steps[vertex] for vertex in cached & set(steps))


def test_a_second_export_copies_its_kept_frames_and_writes_the_same_bundle(
        matrix_engine, matrix_build, tmp_path):
    """Layer frames are kept by the name a save gives a layer (an OCI layout's blob digest,
    Docker 25 and later, either store; on Engine 20.10 a layer.tar's size and first MiB):
    the second export copies every one (none is written anew), and `--no-cache`, the first
    and the second export write the same bytes. It stands before the load tests: on the
    containerd store a load retags the image by the bundle's manifest digest, which the
    build record does not name."""
    copy = Path(str(matrix_build["checkout"]))
    cache = tmp_path / "cache"
    env = {**on(matrix_engine), "STACKPIN_CACHE_DIR": str(cache)}

    def export(name: str, *flags: str) -> bytes:
        done = stackpin(copy, "bundle", "export", MATRIX_CELL, "-o", str(tmp_path / name),
                        *flags, env=env)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        return (tmp_path / name / "images.tar.zst").read_bytes()

    cold = export("cold", "--no-cache")
    assert not (cache / "frames").exists()
    first = export("first")
    kept = {frame: frame.stat().st_ino for frame in (cache / "frames").glob("*/*.zst")}
    second = export("second")
    assert cold == first == second
    info = matrix_engine.image_info(str(matrix_build["image_id"]))
    assert info is not None
    # The containerd store names gzip blobs by their compressed digest, the classic store by
    # the diff ID, 20.10 by size and head: one frame per distinct layer each way.
    assert len(kept) == len(set(info.diff_ids)) > 1
    assert {frame: frame.stat().st_ino for frame in kept} == kept


@pytest.fixture(scope="session")
def matrix_bundle(matrix_engine, matrix_build, tmp_path_factory) -> tuple[Path, Path]:
    """The signed bundle of the matrix image, exported from the engine under test."""
    copy = Path(str(matrix_build["checkout"]))
    work = tmp_path_factory.mktemp("matrix-bundle")
    keys, site = work / "keys", work / "site"
    assert stackpin(copy, "keys", "generate", "-o", str(keys)).returncode == 0
    done = stackpin(copy, "bundle", "export", MATRIX_CELL, "-o", str(site), "--sign-key",
                    str(keys / "stackpin.key"), env=on(matrix_engine))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    # Not a terminal: plain progress lines, each phase ending at 100 % of what it counted.
    # Layers are written while the save streams, so what is left to write after it (the
    # documents, a few KiB) is below the meter's threshold and not shown on its own.
    assert_progress_ends(done.stderr, "save")
    return site, keys / "stackpin.pub"


def assert_progress_ends(stderr: str, *labels: str) -> None:
    """Each of ``labels`` is shown and ends at 100 %; so does every other phase shown."""
    shown = set(re.findall(r"^(\w+): \d+/~?\d+ MiB \(", stderr, re.MULTILINE))
    assert set(labels) <= shown, stderr
    for label in sorted(shown):
        # The rate only when bytes flowed over time (one chunk has none to show).
        (last,) = re.findall(rf"^{label}: (\d+)/(\d+) MiB \(100%\)(?:, .*)? in \d+ s$",
                             stderr, re.MULTILINE)
        assert last[0] == last[1] != "0", stderr


def _id_after_load(engine: DockerEngine, image: dict[str, str]) -> str:
    return engine.version().image_id(config_digest=image["config_digest"],
                                     manifest_digest=image["manifest_digest"])


def test_bundle_export_verify_load_and_start(matrix_engine, matrix_build, matrix_bundle):
    copy = Path(str(matrix_build["checkout"]))
    site, pubkey = matrix_bundle
    image_id = str(matrix_build["image_id"])
    (image,) = json.loads((site / "manifest.json").read_bytes())["images"]
    assert image["id"] == image_id
    # The classic store names the bundled image as the engine did; the containerd store by
    # the manifest of the bundle's uncompressed layout.
    assert (image["config_digest"] == image_id) is (matrix_engine.version().store == "classic")

    done = stackpin(copy, "bundle", "verify", str(site), "--pubkey", str(pubkey))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert_progress_ends(done.stderr, "verify")

    _remove_tags(matrix_engine, image_id)
    done = stackpin(copy, "bundle", "load", str(site), "--pubkey", str(pubkey), "--json",
                    env=on(matrix_engine))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert_progress_ends(done.stderr, "verify", "load")
    loaded_id = _id_after_load(matrix_engine, image)
    assert json.loads(done.stdout)["loaded"] == [loaded_id]

    _remove_tags(matrix_engine, loaded_id)
    done = subprocess.run(["bash", str(site / "bin" / "load.sh"), "--pubkey", str(pubkey)],
                          capture_output=True, text=True, env={**os.environ, **on(matrix_engine)},
                          timeout=1800)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert f"loaded {loaded_id}" in done.stdout
    loaded = matrix_engine.image_info(loaded_id)
    assert loaded is not None
    assert set(image["tags"]) <= set(loaded.tags)
    _assert_starts(matrix_engine, image["tags"][0])


def test_the_bundle_loads_into_every_engine_of_the_matrix(matrix_engine, matrix_bundle):
    site, pubkey = matrix_bundle
    (image,) = json.loads((site / "manifest.json").read_bytes())["images"]
    for name, host in matrix_hosts():
        with DockerEngine.connect(environ={**os.environ, "DOCKER_HOST": host}) as target:
            loaded_id = _id_after_load(target, image)
            if target.image_info(loaded_id) is not None:
                _remove_tags(target, loaded_id)
            try:
                done = stackpin(site.parent, "bundle", "load", str(site), "--pubkey",
                                str(pubkey), "--json", env={"DOCKER_HOST": host})
                assert done.returncode == 0, f"{name}: {done.stdout}\n{done.stderr}"
                assert json.loads(done.stdout)["loaded"] == [loaded_id], name
                _assert_starts(target, image["tags"][0])
            finally:
                if target.url != matrix_engine.url:
                    _remove_tags(target, loaded_id)


def _assert_starts(engine: DockerEngine, reference: str) -> None:
    started = engine.run_to_completion(
        RunRequest(image=reference, network_mode="none",
                   labels={"io.stackpin.test": uuid.uuid4().hex}), timeout_s=120)
    assert (started.exit_code, started.stdout) == (0, f"{MATRIX_CELL}\n"), started.logs


def _remove_tags(engine: DockerEngine, image_id: str) -> None:
    """Empty the store of the image: every tag, then the image itself."""
    info = engine.image_info(image_id)
    for tag in info.tags if info else ():
        engine.remove_image(tag)
    if engine.image_info(image_id) is not None:
        engine.remove_image(image_id, force=True)
    assert engine.image_info(image_id) is None


