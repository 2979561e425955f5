"""The engine boundary against the real daemon, on the CPU default's bootstrapped base."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from stackpin.bootstrap import base_reference, load_rootfs, rootfs_path
from stackpin.engine import BindMount, BuildRequest, RunRequest, SaveRequest, chunk_stream
from stackpin.engine.docker_api import DockerEngine
from stackpin.engine.save_format import image_layout, read_save
from stackpin.errors import BuildError, HostEnvironmentError

pytestmark = pytest.mark.docker


# Every test here runs on each engine of the matrix (conftest.matrix_engine).
@pytest.fixture
def docker_engine(matrix_engine: DockerEngine) -> DockerEngine:
    return matrix_engine


@pytest.fixture
def cpu_base(matrix_base: str) -> str:
    return matrix_base


def _docker(engine: DockerEngine, *args: str) -> str:
    """The docker CLI against the engine under test (the witness of what is left behind)."""
    return subprocess.run(["docker", "-H", engine.url, *args], capture_output=True, text=True,
                          check=True).stdout


def _context(tmp_path, dockerfile: str):
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(dockerfile)
    return context


def _build(engine, tmp_path, dockerfile: str, **options):
    tag = f"stackpin-test/engine:{uuid.uuid4().hex[:12]}"
    request = BuildRequest(
        context_dir=_context(tmp_path, dockerfile),
        tags=(tag,),
        log_path=tmp_path / "logs" / "build.log",
        **options,
    )
    return request, tag


@pytest.fixture
def cleanup_images(docker_engine):
    references: list[str] = []
    yield references
    for reference in references:
        docker_engine.remove_image(reference, force=True)


def _stackpin_containers(engine: DockerEngine) -> list[str]:
    out = _docker(engine, "ps", "-a", "--filter", "name=stackpin-", "--format", "{{.Names}}")
    return sorted(n for n in out.split() if n.startswith("stackpin-"))


def _marked_containers(engine: DockerEngine, marker: str) -> list[str]:
    out = _docker(engine, "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}")
    return [line for line in out.splitlines() if marker in line]


def test_bootstrapped_base_creates_a_working_venv(docker_engine, cpu_base):
    result = docker_engine.run_to_completion(
        RunRequest(
            image=cpu_base,
            command=("sh", "-c",
                     "python3 -m venv /tmp/v && /tmp/v/bin/python -c 'import sys; print(sys.version)'"
                     " && echo LANG=$LANG"),
        ),
        timeout_s=120,
    )

    assert (result.exit_code, result.timed_out) == (0, False), result.logs
    assert result.stdout.startswith("3.11.")
    assert "LANG=C.UTF-8" in result.stdout


def test_base_image_is_dated_by_source_date_epoch_and_reloads_to_the_same_id(
    docker_engine, cpu_base, cpu_bootstrap, base_cache_dir
):
    info = docker_engine.image_info(cpu_base)
    rootfs = rootfs_path(cpu_bootstrap, base_cache_dir)

    reloaded = load_rootfs(docker_engine, cpu_bootstrap, rootfs)

    assert cpu_base == base_reference(cpu_bootstrap)
    assert info.created.startswith("2025-01-01T00:00:00")
    assert info.cmd == ("/bin/bash",)
    assert info.diff_ids == (f"sha256:{hashlib.sha256(rootfs.read_bytes()).hexdigest()}",)
    assert reloaded.id == info.id


def test_offline_build_runs_pure_steps_and_counts_cache_hits(
    docker_engine, cpu_base, tmp_path, cleanup_images
):
    marker = uuid.uuid4().hex
    dockerfile = f"FROM {cpu_base}\nRUN echo {marker} > /pure\n"
    request, tag = _build(
        docker_engine, tmp_path, dockerfile, network_mode="none",
        labels={"io.stackpin.test": marker},
    )
    cleanup_images.append(tag)
    lines: list[str] = []

    first = docker_engine.build(request, on_line=lines.append)
    again = docker_engine.build(replace(request, log_path=tmp_path / "again.log"))

    # The classic builder turns build labels into a third step, LABEL, after the last one.
    assert (first.steps, first.cached_steps) == (3, 0)
    assert (again.steps, again.cached_steps) == (3, 2)
    assert again.image_id == first.image_id
    assert f"Step 2/3 : RUN echo {marker} > /pure" in lines
    assert request.log_path.read_text().splitlines() == lines
    listed = docker_engine.list_images(f"io.stackpin.test={marker}")
    assert [i.id for i in listed] == [first.image_id]
    assert tag in listed[0].tags


def test_offline_build_step_that_needs_the_network_fails(docker_engine, cpu_base, tmp_path):
    dockerfile = (
        f"FROM {cpu_base}\n"
        "RUN python3 -c \"import urllib.request; "
        "urllib.request.urlopen('http://deb.debian.org/debian/', timeout=20)\"\n"
    )
    request, _ = _build(docker_engine, tmp_path, dockerfile, network_mode="none")

    with pytest.raises(BuildError) as caught:
        docker_engine.build(request)

    assert caught.value.step.startswith("Step 2/2 : RUN python3 -c")
    assert "URLError" in request.log_path.read_text()


def test_failing_step_is_named_with_its_log(docker_engine, cpu_base, tmp_path):
    dockerfile = f"FROM {cpu_base}\nRUN echo fine\nRUN echo about to fail && exit 3\nRUN echo never\n"
    request, tag = _build(docker_engine, tmp_path, dockerfile, network_mode="none")

    with pytest.raises(BuildError) as caught:
        docker_engine.build(request)

    error = caught.value
    assert error.return_code == 5
    assert error.step == "Step 3/4 : RUN echo about to fail && exit 3"
    assert "returned a non-zero code: 3" in error.message
    assert error.log_path == str(request.log_path)
    log = request.log_path.read_text()
    assert "about to fail" in log
    assert "Step 4/4" not in log
    assert docker_engine.image_info(tag) is None


def test_missing_dockerfile_is_a_build_error_before_any_step(docker_engine, tmp_path):
    context = tmp_path / "empty"
    context.mkdir()
    request = BuildRequest(context_dir=context, tags=("stackpin-test/none:x",),
                           log_path=tmp_path / "none.log")

    with pytest.raises(BuildError, match="before the first step"):
        docker_engine.build(request)

    assert (tmp_path / "none.log").exists()


def test_ctrl_c_during_a_build_leaves_no_container(docker_engine, cpu_base, tmp_path):
    marker = uuid.uuid4().hex
    dockerfile = f"FROM {cpu_base}\nRUN echo started-{marker} && sleep 300\n"
    request, tag = _build(docker_engine, tmp_path, dockerfile, network_mode="none")

    def interrupt_once_running(line: str) -> None:
        # The RUN step's own output proves its container exists and is running.
        if line.strip() == f"started-{marker}":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        docker_engine.build(request, on_line=interrupt_once_running)

    # The daemon cancels the build when the connection closes; forcerm removes the
    # container. Poll: the removal is asynchronous to our return.
    deadline = time.monotonic() + 60
    while _marked_containers(docker_engine, marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _marked_containers(docker_engine, marker) == []
    assert docker_engine.image_info(tag) is None
    assert f"started-{marker}" in request.log_path.read_text()


@pytest.mark.parametrize("interrupt", [RuntimeError, KeyboardInterrupt])
def test_container_is_removed_when_the_block_raises(docker_engine, cpu_base, interrupt):
    seen: list[str] = []

    def fail_inside() -> None:
        with docker_engine.container(RunRequest(image=cpu_base, command=("sleep", "300"))) as c:
            seen.append(c.name)
            seen.extend(_stackpin_containers(docker_engine))
            raise interrupt

    with pytest.raises(interrupt):
        fail_inside()

    assert seen[0].startswith("stackpin-")
    assert seen[0] in seen[1:]  # it existed while the block ran
    assert seen[0] not in _stackpin_containers(docker_engine)


def test_run_times_out_and_still_cleans_up(docker_engine, cpu_base):
    before = set(_stackpin_containers(docker_engine))

    result = docker_engine.run_to_completion(
        RunRequest(image=cpu_base, command=("sh", "-c", "echo waiting; sleep 300")), timeout_s=2
    )

    assert (result.timed_out, result.exit_code) == (True, -1)
    assert "waiting" in result.logs
    assert set(_stackpin_containers(docker_engine)) <= before


def test_a_bind_mount_returns_files(docker_engine, cpu_base, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    request = RunRequest(
        image=cpu_base,
        command=("sh", "-c", "echo '{\"ok\": true}' > /reports/r.json"),
        mounts=(BindMount(source=reports, target="/reports"),),
        network_mode="none",
    )

    result = docker_engine.run_to_completion(request, timeout_s=60)

    assert result.exit_code == 0, result.logs
    assert json.loads((reports / "r.json").read_text()) == {"ok": True}


def test_unknown_image_is_refused_with_the_reference(docker_engine):
    missing = f"stackpin-test/missing:{uuid.uuid4().hex[:12]}"
    before = set(_stackpin_containers(docker_engine))

    with pytest.raises(HostEnvironmentError, match=f"refused to run {missing}"):
        docker_engine.run_to_completion(RunRequest(image=missing), timeout_s=10)

    assert set(_stackpin_containers(docker_engine)) <= before


def test_save_then_load_round_trips_several_tags_in_one_stream(
    docker_engine, cpu_base, cleanup_images
):
    suffix = uuid.uuid4().hex[:12]
    aliases = [f"stackpin-test/alias-a:{suffix}", f"stackpin-test/alias-b:{suffix}"]
    for alias in aliases:
        docker_engine.tag(cpu_base, alias)
    cleanup_images.extend(aliases)
    base_id = docker_engine.image_info(cpu_base).id

    archive = b"".join(docker_engine.save(SaveRequest(images=tuple(aliases))))
    for alias in aliases:
        docker_engine.remove_image(alias)
    # Loaded from an iterator of chunks, as a bundle reader streams it.
    chunks = (archive[i : i + 65536] for i in range(0, len(archive), 65536))
    loaded = docker_engine.load(chunks)

    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert sorted(t for entry in manifest for t in entry["RepoTags"]) == aliases
    assert sorted(loaded.references) == aliases
    assert set(loaded.image_ids) == {base_id}


def test_saving_an_unknown_image_names_it(docker_engine):
    missing = f"stackpin-test/missing:{uuid.uuid4().hex[:12]}"

    with pytest.raises(HostEnvironmentError, match=missing):
        b"".join(docker_engine.save(SaveRequest(images=(missing,))))


def test_loading_a_damaged_archive_is_refused(docker_engine, tmp_path):
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(b"this is not a docker save archive" * 100)

    with pytest.raises(HostEnvironmentError, match="could not load the archive"):
        docker_engine.load(damaged)


def test_version_reports_the_daemon(docker_engine):
    version = docker_engine.version()

    assert version.os == "linux"
    assert version.api_version


def test_copied_files_carry_the_clamped_mtime_and_normal_mode(
    docker_engine, cpu_base, tmp_path, cleanup_images
):
    request, tag = _build(
        docker_engine, tmp_path, f"FROM {cpu_base}\nCOPY data.txt /data.txt\n",
        network_mode="none", source_date_epoch=1735689600,
    )
    data = request.context_dir / "data.txt"
    data.write_text("payload\n")
    data.chmod(0o664)  # as a checkout under umask 002 leaves it
    cleanup_images.append(tag)

    docker_engine.build(request)
    result = docker_engine.run_to_completion(
        RunRequest(image=tag, command=("stat", "-c", "%Y %a %u", "/data.txt"), network_mode="none"),
        timeout_s=60,
    )

    assert result.stdout.split() == ["1735689600", "644", "0"]


def test_pull_without_a_registry_says_to_load_a_tar(docker_engine):
    # Port 1 on loopback refuses at once: the daemon's answer for an unreachable registry.
    with pytest.raises(HostEnvironmentError) as caught:
        docker_engine.pull("127.0.0.1:1/vendor/dtk:26.04")

    assert caught.value.message.startswith("cannot pull 127.0.0.1:1/vendor/dtk:26.04: ")
    assert "(--base-tar)" in caught.value.message
    assert "\n" not in caught.value.message


def _layer_names(data) -> list[str]:
    with tarfile.open(fileobj=data, mode="r|") as tar:
        return [m.name for m in tar]


def test_the_save_stream_reads_back_to_what_the_engine_reports(docker_engine, cpu_base):
    info = docker_engine.image_info(cpu_base)
    version = docker_engine.version()

    stream = chunk_stream(docker_engine.save(SaveRequest(images=(cpu_base,))))
    contents = read_save(stream, _layer_names)

    entry = contents.entry_for(info.id)
    assert contents.layout == ("docker-archive" if version.version.startswith("20.") else "oci")
    assert info.id == version.image_id(config_digest=entry.config_digest,
                                       manifest_digest=entry.manifest_digest)
    assert tuple(layer.diff_id for layer in contents.layers_of(entry)) == info.diff_ids
    assert "./etc/os-release" in contents.layers_of(entry)[0].value


def test_a_written_layout_loads_under_the_id_the_store_gives_it(docker_engine, tmp_path,
                                                                 cleanup_images):
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        data = uuid.uuid4().hex.encode()  # a layer no engine holds yet
        member = tarfile.TarInfo("marker")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    diff_id = f"sha256:{hashlib.sha256(layer.read_bytes()).hexdigest()}"
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    tag = f"stackpin-test/layout:{uuid.uuid4().hex[:12]}"
    written = image_layout(config, [(diff_id, layer)], tags=(tag,))
    cleanup_images.append(tag)

    loaded = docker_engine.load(written.chunks)

    expected = docker_engine.version().image_id(config_digest=written.config_digest,
                                                manifest_digest=written.manifest_digest)
    assert loaded.image_ids == (expected,)
    assert docker_engine.image_info(tag).diff_ids == (diff_id,)


def test_doctor_reports_the_engine_and_its_store(docker_engine):
    done = subprocess.run([sys.executable, "-m", "stackpin.cli.main", "doctor", "--json"],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "DOCKER_HOST": docker_engine.url})

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    version = docker_engine.version()
    assert (report["engine"], report["store"]) == (version.version, version.store)
    assert report["problems"] == []
    assert "runc" in report["runtimes"]
    # Every engine of the matrix runs on this host: its data folder's free space is known.
    root = report["root_dir"]
    assert root and Path(root).is_dir()
    assert abs(report["disk_free_bytes"] - shutil.disk_usage(root).free) < (1 << 30)
