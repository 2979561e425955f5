"""The BuildKit path: which builder, the buildx command, its plain progress, its plumbing.

Progress fixtures are real buildx 0.29.1 output (tests/unit/fixtures/buildkit/). The
plumbing runs a stand-in ``docker`` on PATH that behaves as buildx does at the process
boundary (context tar on stdin, progress on stderr, the image tar on stdout, a metadata
file), so a loaded ID that differs from the reported one, a failing exit and a missing CLI
are each checked without a daemon.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from stackpin.engine import BuildRequest
from stackpin.engine.builders import select_builder
from stackpin.engine.buildx import BuildkitTally, buildx_argv, run_buildx
from stackpin.engine.types import EngineVersion, engine_report
from stackpin.errors import BuildError, HostEnvironmentError

FIXTURES = Path(__file__).parent / "fixtures" / "buildkit"
DIGEST = "sha256:" + "ab" * 32


def report(version: str = "28.5.2", *, store: str = "classic", api: str = "1.51"):
    engine = EngineVersion(version=version, api_version=api, os="linux", arch="amd64",
                           store=store)
    return engine_report(engine, {"Runtimes": {"runc": {}}})


# --- which builder ---------------------------------------------------------------------


@pytest.mark.parametrize(("version", "store", "builder", "native", "rewrite"), [
    # Either store: the engine clamps the config, the Dockerfile's steps their layers, and
    # the image exporter writes them as they are: nothing to normalise, no tar to load.
    ("28.5.2", "containerd", "buildkit", True, False),
    ("28.5.2", "classic", "buildkit", True, False),
    ("25.0.3", "containerd", "buildkit", False, False),  # BuildKit 0.12: config not clamped
    ("25.0.3", "classic", "buildkit", False, False),
    ("20.10.24", "classic", "classic", False, False),  # BuildKit opt-in, no SOURCE_DATE_EPOCH
])
def test_auto_prefers_buildkit_where_it_is_the_engines_default(version, store, builder,
                                                                native, rewrite):
    choice = select_builder("auto", report=report(version, store=store), buildx="0.29.1")
    assert (choice.builder, choice.native_timestamps, choice.rewrite_timestamps) == (
        builder, native, rewrite)
    if native and not rewrite:
        assert "clamped by the engine (config) and the build steps (layers)" in choice.reason


def test_auto_without_buildx_or_daemon_buildkit_falls_back_to_classic_and_says_why():
    no_plugin = select_builder("auto", report=report(), buildx="")
    assert no_plugin.builder == "classic" and "buildx" in no_plugin.reason
    old_api = select_builder("auto", report=report("18.09.0", api="1.38"), buildx="0.29.1")
    assert old_api.builder == "classic" and "1.38" in old_api.reason


@pytest.mark.parametrize(("engine", "buildx", "named"), [
    (report(), "", "buildx plugin"),
    (report("18.09.0", api="1.38"), "0.29.1", "no BuildKit"),
])
def test_buildkit_requested_where_it_cannot_run_is_one_line_exit_8(engine, buildx, named):
    with pytest.raises(HostEnvironmentError) as caught:
        select_builder("buildkit", report=engine, buildx=buildx)
    assert named in caught.value.message and "--builder classic" in caught.value.message
    assert caught.value.return_code == 8 and "\n" not in caught.value.message


def test_buildkit_requested_on_engine_20_uses_it_and_classic_is_always_classic():
    engine = report("20.10.24", api="1.41")
    assert select_builder("buildkit", report=engine, buildx="0.29.1").builder == "buildkit"
    assert select_builder("classic", report=report(store="containerd"),
                          buildx="0.29.1").builder == "classic"


# --- the command --------------------------------------------------------------------------


def request(tmp_path: Path, **overrides) -> BuildRequest:
    fields = dict(context_dir=tmp_path, tags=("stackpin/x:stable-1", "stackpin/x:stable"),
                  labels={"b": "2", "a": "1"}, network_mode="none", nocache=True,
                  source_date_epoch=1735689600, log_path=tmp_path / "build.log",
                  builder="buildkit")
    return BuildRequest(**{**fields, **overrides})  # type: ignore[arg-type]


def test_buildx_argv_is_offline_without_attestations_and_reads_the_context_from_stdin(tmp_path):
    argv = buildx_argv(request(tmp_path), metadata_file=tmp_path / "m.json")
    assert argv[:6] == ["docker", "buildx", "build", "--builder", "default", "--progress"]
    assert argv[-1] == "-"
    joined = " ".join(argv)
    for part in ("--network none", "--no-cache", "--provenance=false", "--sbom=false",
                 "--tag stackpin/x:stable-1 --tag stackpin/x:stable",
                 "--label a=1 --label b=2", "--build-arg SOURCE_DATE_EPOCH=1735689600",
                 f"--metadata-file {tmp_path / 'm.json'}", "--output type=image"):
        assert part in joined
    assert "--pull" not in argv and "rewrite-timestamp" not in joined


def test_native_timestamps_stream_a_docker_tar_with_rewritten_timestamps(tmp_path):
    argv = buildx_argv(request(tmp_path, rewrite_timestamps=True), metadata_file=tmp_path)
    assert argv[argv.index("--output") + 1] == "type=docker,dest=-,rewrite-timestamp=true"


# --- plain progress -------------------------------------------------------------------------


def tally_of(name: str) -> BuildkitTally:
    tally = BuildkitTally()
    for line in (FIXTURES / name).read_text().splitlines():
        tally.add(line)
    return tally


def test_progress_counts_steps_and_real_cache_hits_not_from():
    cached = tally_of("cached-native-28-containerd.log")
    assert list(cached.steps.values()) == [
        "[1/3] FROM docker.io/stackpin/base-bookworm:eff575722d7d@sha256:cdbd24166a3490dfa5b7"
        "3904f109cef2457327f0152fbe47a655e476ecc54af1",
        "[2/3] COPY a.txt /opt/a.txt",
        "[3/3] RUN echo hi > /opt/b.txt && mkdir -p /opt/d && touch /opt/d/e",
    ]
    assert cached.cached_steps == 2 and not cached.error
    fresh = tally_of("image-20.10.log")
    assert (len(fresh.steps), fresh.cached_steps) == (3, 1)


def test_progress_of_a_failed_run_names_the_step_and_the_process_error():
    failed = tally_of("failed-run-28.log")
    assert failed.failed_step == "[3/3] RUN echo oops >&2 && exit 3"
    assert failed.error == ('process "/bin/sh -c echo oops >&2 && exit 3" did not complete '
                            'successfully: exit code: 3')


# --- the process boundary ---------------------------------------------------------------------

FAKE_DOCKER = """#!{python}
import json, os, sys, tarfile
argv = sys.argv[1:]
if argv[:2] == ["builder", "prune"]:
    with open(os.environ["FAKE_SEEN"] + ".prune", "a") as seen:
        seen.write(" ".join(argv) + "\\n")
    print("Total:\\t3.1GB")
    sys.exit(0)
if os.environ.get("FAKE_UNREAD"):  # buildx refusing at once, before reading the context
    sys.stderr.write("ERROR: failed to build: refused early\\n")
    sys.exit(1)
names = tarfile.open(fileobj=sys.stdin.buffer, mode="r|").getnames()
with open(os.environ["FAKE_SEEN"], "w") as seen:
    json.dump({{"argv": argv, "context": names}}, seen)
sys.stderr.write(open(os.environ["FAKE_LOG"]).read())
if "type=docker,dest=-,rewrite-timestamp=true" in argv:
    sys.stdout.buffer.write(b"IMAGE-TAR" * 1000)
if os.environ.get("FAKE_EXIT", "0") == "0":
    with open(argv[argv.index("--metadata-file") + 1], "w") as meta:
        json.dump({{"containerimage.digest": os.environ["FAKE_DIGEST"]}}, meta)
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


@pytest.fixture
def fake_docker(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(FAKE_DOCKER.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SEEN", str(tmp_path / "seen.json"))
    monkeypatch.setenv("FAKE_LOG", str(FIXTURES / "cached-native-28-containerd.log"))
    monkeypatch.setenv("FAKE_DIGEST", DIGEST)
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    (context / "a.txt").write_text("a\n")
    return context


class Loads:
    def __init__(self, ids: tuple[str, ...]) -> None:
        self.ids, self.data = ids, b""

    def __call__(self, chunks):
        self.data = b"".join(chunks)
        return self.ids


def test_the_image_tar_goes_to_load_and_the_reported_id_is_the_loaded_one(fake_docker,
                                                                          tmp_path):
    load, lines = Loads((DIGEST,)), []
    outcome = run_buildx(request(fake_docker, rewrite_timestamps=True), docker_host="unix:///x",
                         emit=lines.append, load=load)
    assert outcome.image_id == DIGEST and load.data == b"IMAGE-TAR" * 1000
    assert lines[-2] == "#7 DONE 4.4s" and len(outcome.tally.steps) == 3  # then the prune
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert sorted(seen["context"]) == ["Dockerfile", "a.txt"]  # the normalised tar, on stdin


def test_a_load_that_gives_another_image_fails_the_build(fake_docker):
    with pytest.raises(BuildError) as caught:
        run_buildx(request(fake_docker, rewrite_timestamps=True), docker_host="unix:///x",
                   emit=lambda _line: None, load=Loads(("sha256:" + "cd" * 32,)))
    assert DIGEST in caught.value.message and "loaded sha256:cdcd" in caught.value.message


def test_the_image_exporter_path_loads_nothing(fake_docker):
    load = Loads(())
    outcome = run_buildx(request(fake_docker), docker_host="unix:///x",
                         emit=lambda _line: None, load=load)
    assert outcome.image_id == DIGEST and load.data == b""


def test_a_failed_build_names_the_step_and_never_loads(fake_docker, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "1")
    monkeypatch.setenv("FAKE_LOG", str(FIXTURES / "failed-run-28.log"))
    load = Loads((DIGEST,))
    with pytest.raises(BuildError) as caught:
        run_buildx(request(fake_docker), docker_host="unix:///x", emit=lambda _line: None,
                   load=load)
    assert caught.value.message.startswith("build failed at [3/3] RUN echo oops >&2 && exit 3: ")
    assert "exit code: 3" in caught.value.message and load.data == b""


def test_a_buildx_that_stops_reading_the_context_fails_with_its_own_words(fake_docker,
                                                                         monkeypatch):
    # 4 MiB is more than a pipe holds: the writer meets a closed pipe, which is not the error.
    (fake_docker / "big.bin").write_bytes(b"x" * (4 << 20))
    monkeypatch.setenv("FAKE_UNREAD", "1")
    with pytest.raises(BuildError) as caught:
        run_buildx(request(fake_docker), docker_host="unix:///x", emit=lambda _line: None,
                   load=Loads(()))
    assert "refused early" in caught.value.message


def test_a_context_that_cannot_be_read_stops_buildx_and_says_so(fake_docker, monkeypatch):
    def half_then_fail(context_dir, out, **_kw):
        out.write(b"\0" * 512)
        raise PermissionError(13, "Permission denied", str(context_dir / "a.txt"))

    monkeypatch.setattr("stackpin.engine.buildx.write_build_context", half_then_fail)
    with pytest.raises(BuildError) as caught:
        run_buildx(request(fake_docker), docker_host="unix:///x", emit=lambda _line: None,
                   load=Loads(()))
    assert caught.value.message.startswith("could not send the build context ")
    assert "Permission denied" in caught.value.message and caught.value.step == "context"


@pytest.mark.parametrize("fails", [False, True])
def test_the_engine_gives_back_the_context_upload_after_each_build(fake_docker, tmp_path,
                                                                   monkeypatch, fails):
    if fails:
        monkeypatch.setenv("FAKE_EXIT", "1")
    lines: list[str] = []
    with contextlib.suppress(BuildError):
        run_buildx(request(fake_docker), docker_host="unix:///x", emit=lines.append,
                   load=Loads(()))
    pruned = (tmp_path / "seen.json.prune").read_text().splitlines()
    assert pruned == ["builder prune --force --filter description~=buildkit-session"]
    assert lines[-1] == "stackpin: gave back the engine's copy of the uploaded build context (3.1GB)"


def test_no_docker_cli_is_one_line_exit_8(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(HostEnvironmentError) as caught:
        run_buildx(request(tmp_path), docker_host="unix:///x", emit=lambda _line: None,
                   load=Loads(()))
    assert "docker CLI not found" in caught.value.message and caught.value.return_code == 8



def test_a_full_disk_under_buildkit_gets_the_same_way_out(tmp_path):
    from stackpin.engine.buildx import buildkit_failure

    tally = BuildkitTally(failed_step="[5/9] RUN pip install",
                          error="failed to copy files: write /x: no space left on device")
    error = buildkit_failure(tally, tmp_path / "b.log", 1)
    assert error.message.startswith("build failed at [5/9] RUN pip install: failed to copy")
    assert "the Docker host's disk is full, not the step" in error.message
    assert error.step == "[5/9] RUN pip install"
    nothing = buildkit_failure(BuildkitTally(), tmp_path / "b.log", 7)
    assert nothing.message.startswith("build failed at before the first step (context or ")
    assert "docker buildx exited 7" in nothing.message and "disk is full" not in nothing.message
