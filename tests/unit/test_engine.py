"""The engine boundary without a daemon: request translation, stream parsing, errors."""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import socketserver
import subprocess
import sys
import tarfile
import threading

import pytest

from stackpin.engine import (
    BindMount,
    BuildRequest,
    RunRequest,
    digest_matches,
    image_info_from_inspect,
    with_run_flags,
)
from stackpin.engine.docker_api import (
    DockerEngine,
    container_kwargs,
    container_name,
    gpu_device_request,
    host_config_kwargs,
)
from stackpin.engine.docker_build import (
    BuildTally,
    build_failure,
    build_kwargs,
    finish_build_stream,
    tally_build_event,
    write_build_context,
)
from stackpin.engine.types import unpacked_size
from stackpin.errors import BuildError, HostEnvironmentError
from stackpin.matrix import RunFlags


def parse_build_stream(json_lines: list[str]) -> BuildTally:
    """The tally of a whole saved stream, folded as DockerEngine.build folds the live one."""
    tally = BuildTally()
    for raw in json_lines:
        if raw.strip():
            tally, _ = tally_build_event(tally, json.loads(raw))
    return finish_build_stream(tally)[0]


# What docker 20.10's classic builder sends for a three-step build whose last RUN fails,
# captured as JSON lines (one event per line, as the daemon streams them).
FAILING_STREAM = [
    '{"stream":"Step 1/3 : FROM stackpin/base-bookworm:0123456789ab"}',
    '{"stream":"\\n"}',
    '{"stream":" ---\\u003e 5d0da3dc9764\\n"}',
    '{"stream":"Step 2/3 : RUN echo pure \\u003e /pure"}',
    '{"stream":"\\n"}',
    '{"stream":" ---\\u003e Using cache\\n"}',
    '{"stream":" ---\\u003e 8a1f2b3c4d5e\\n"}',
    '{"stream":"Step 3/3 : RUN pip install --no-index torch"}',
    '{"stream":"\\n"}',
    '{"stream":" ---\\u003e Running in 0f9e8d7c6b5a\\n"}',
    '{"stream":"ERROR: Could not find a version that satisfies the requirement torch\\n"}',
    '{"errorDetail":{"code":1,"message":"The command \'/bin/sh -c pip install --no-index'
    ' torch\' returned a non-zero code: 1"},"error":"The command \'/bin/sh -c pip install'
    ' --no-index torch\' returned a non-zero code: 1"}',
]

SUCCESS_STREAM = [
    '{"stream":"Step 1/2 : FROM stackpin/base-bookworm:0123456789ab\\n"}',
    '{"stream":" ---\\u003e 5d0da3dc9764\\n"}',
    '{"stream":"Step 2/2 : RUN echo pure \\u003e /pure\\n"}',
    '{"stream":" ---\\u003e Using cache\\n"}',
    '{"stream":" ---\\u003e 8a1f2b3c4d5e\\n"}',
    '{"aux":{"ID":"sha256:8a1f2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8"}}',
    '{"stream":"Successfully built 8a1f2b3c4d5e\\n"}',
]


def test_failing_stream_names_the_last_step_and_the_reason():
    tally = parse_build_stream(FAILING_STREAM)

    assert tally.current_step == "Step 3/3 : RUN pip install --no-index torch"
    assert tally.steps == 3
    assert tally.cached_steps == 1
    assert "returned a non-zero code: 1" in tally.error
    assert tally.image_id == ""


def test_build_failure_is_one_line_with_step_and_log(tmp_path):
    log = tmp_path / "logs" / "cpu-stable.log"

    error = build_failure(parse_build_stream(FAILING_STREAM), log)

    assert isinstance(error, BuildError)
    assert error.return_code == 5
    assert error.step == "Step 3/3 : RUN pip install --no-index torch"
    assert error.log_path == str(log)
    assert "\n" not in error.message
    assert error.message.startswith("build failed at Step 3/3 : RUN pip install")
    assert error.message.endswith(f"full log: {log}")


def test_failure_before_any_step_says_so(tmp_path):
    tally = BuildTally(error="Cannot locate specified Dockerfile: Dockerfile")

    error = build_failure(tally, tmp_path / "x.log")

    assert error.step == ""
    assert "before the first step" in error.message


# What Docker 20.10 printed when the CI host's disk filled during the stack install.
DISK_FULL = ("Error processing tar file(exit status 1): write /opt/stackpin/venv/lib/python3.11/"
             "site-packages/pyarrow/libarrow.so.2300: no space left on device")


def test_a_full_disk_is_named_as_the_host_s_not_the_step_s(tmp_path):
    step = "Step 8/24 : RUN /opt/stackpin/venv/bin/pip install --no-index"
    error = build_failure(BuildTally(current_step=step, error=DISK_FULL), tmp_path / "x.log")

    assert error.message == (
        f"build failed at {step}: {DISK_FULL} (the Docker host's disk is full, not the step: "
        f"see `docker system df`, remove images you no longer need, and rerun); "
        f"full log: {tmp_path / 'x.log'}"
    )
    assert error.return_code == 5 and error.step == step


def test_a_step_s_own_failure_gets_no_disk_hint(tmp_path):
    error = build_failure(parse_build_stream(FAILING_STREAM), tmp_path / "x.log")
    assert "disk is full" not in error.message


def test_success_stream_counts_steps_cache_hits_and_image_id():
    tally = parse_build_stream(SUCCESS_STREAM)

    assert tally.error == ""
    assert (tally.steps, tally.cached_steps) == (2, 1)
    assert tally.image_id.startswith("sha256:8a1f2b3c4d5e")


def test_lines_split_across_events_are_joined_and_the_tail_is_flushed():
    tally, lines = tally_build_event(BuildTally(), {"stream": "Step 1/1 : RUN ec"})
    assert lines == []
    tally, lines = tally_build_event(tally, {"stream": "ho hi\nhi\nno newline"})
    assert lines == ["Step 1/1 : RUN echo hi", "hi"]
    assert tally.steps == 1

    tally, tail = finish_build_stream(tally)

    assert tail == ["no newline"]
    assert tally.partial == ""


def test_pull_progress_is_not_printed_but_status_is():
    _, progress = tally_build_event(
        BuildTally(), {"status": "Downloading", "progress": "[=>  ]", "id": "abc"}
    )
    _, status = tally_build_event(BuildTally(), {"status": "Pull complete", "id": "abc"})

    assert progress == []
    assert status == ["abc Pull complete"]


def test_build_kwargs_keep_the_network_mode_and_ignore_client_proxies(tmp_path):
    request = BuildRequest(
        context_dir=tmp_path,
        tags=("stackpin/cpu:stable-0123456789ab", "stackpin/cpu:stable"),
        labels={"io.stackpin.cell": "cpu"},
        buildargs={"PIP_NO_INDEX": "1"},
        network_mode="none",
        nocache=True,
        log_path=tmp_path / "build.log",
    )

    kwargs = build_kwargs(request)

    assert kwargs == {
        "custom_context": True,
        "dockerfile": "Dockerfile",
        "labels": {"io.stackpin.cell": "cpu"},
        "buildargs": {"PIP_NO_INDEX": "1"},
        "network_mode": "none",
        "nocache": True,
        "pull": False,
        "rm": True,
        "forcerm": True,
        "decode": True,
        "use_config_proxy": False,
    }


def test_container_names_are_unique_and_prefixed():
    names = {container_name() for _ in range(50)}

    assert len(names) == 50
    assert all(re.fullmatch(r"stackpin-[0-9a-f]{32}", n) for n in names)


def test_run_request_translates_to_loopback_ports_binds_and_devices(tmp_path):
    request = RunRequest(
        image="stackpin/dtk:stable",
        command=("python", "-m", "stackpin_verify"),
        environment={"HIP_VISIBLE_DEVICES": "0"},
        devices=("/dev/kfd", "/dev/dri"),
        group_add=("video",),
        volumes=("/opt/hyhal:/opt/hyhal:ro",),
        mounts=(BindMount(source=tmp_path, target="/reports"),),
        shm_size="32g",
        ipc_mode="host",
        ports={8000: 18887},
        workdir="/work",
    )

    host = host_config_kwargs(request)
    create = container_kwargs(request, "stackpin-abc")

    assert host["port_bindings"] == {8000: ("127.0.0.1", 18887)}
    assert host["binds"] == ["/opt/hyhal:/opt/hyhal:ro", f"{tmp_path}:/reports:rw"]
    assert host["devices"] == ["/dev/kfd", "/dev/dri"]
    assert host["group_add"] == ["video"]
    assert (host["shm_size"], host["ipc_mode"]) == ("32g", "host")
    assert "network_mode" not in host
    assert "device_requests" not in host
    assert create["name"] == "stackpin-abc"
    assert create["command"] == ["python", "-m", "stackpin_verify"]
    assert create["ports"] == [8000]
    assert create["working_dir"] == "/work"
    assert "entrypoint" not in create
    assert "user" not in create


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("all", {"count": -1, "capabilities": [["gpu"]]}),
        ("2", {"count": 2, "capabilities": [["gpu"]]}),
        ("device=0,1", {"device_ids": ["0", "1"], "capabilities": [["gpu"]]}),
    ],
)
def test_gpu_requests_follow_docker_run_gpus(gpus, expected):
    assert gpu_device_request(gpus) == expected
    assert host_config_kwargs(RunRequest(image="x", gpus=gpus))["device_requests"] == [expected]


INSPECT = {
    "Id": "sha256:" + "ab" * 32,
    "RepoTags": ["stackpin/base-bookworm:0123456789ab"],
    "RepoDigests": ["vendor/dtk@sha256:" + "cd" * 32],
    "Created": "2025-01-01T00:00:00Z",
    "Size": 115822080,
    "Architecture": "amd64",
    "Os": "linux",
    "Config": {"Env": ["LANG=C.UTF-8"], "Cmd": ["/bin/bash"], "Entrypoint": None,
               "Labels": {"io.stackpin.cell": "cpu"}},
    "RootFS": {"Type": "layers", "Layers": ["sha256:" + "ef" * 32]},
}


def test_image_info_reads_the_inspect_document():
    info = image_info_from_inspect(INSPECT)

    assert info.id == "sha256:" + "ab" * 32
    assert info.tags == ("stackpin/base-bookworm:0123456789ab",)
    assert info.labels == {"io.stackpin.cell": "cpu"}
    assert (info.env, info.cmd, info.entrypoint) == (("LANG=C.UTF-8",), ("/bin/bash",), ())
    assert info.diff_ids == ("sha256:" + "ef" * 32,)
    assert info.size == 115822080


def test_pinned_digest_matches_image_id_or_registry_digest_only():
    info = image_info_from_inspect(INSPECT)

    assert digest_matches(info, "sha256:" + "ab" * 32)
    assert digest_matches(info, "sha256:" + "cd" * 32)
    assert not digest_matches(info, "sha256:" + "ef" * 32)


def test_no_daemon_gives_one_line_that_says_how_to_start_one():
    with pytest.raises(HostEnvironmentError) as caught:
        DockerEngine.connect(environ={"DOCKER_HOST": "unix:///nonexistent.sock"}, timeout_s=5)

    error = caught.value
    assert error.return_code == 8
    assert error.message == (
        "no Docker daemon answers at unix:///nonexistent.sock: start one "
        "(e.g. `dockerd &` as root, or `systemctl start docker`)"
    )


def test_canned_streams_are_valid_json_lines():
    # Guards the fixtures above: a typo would make the parser tests vacuous.
    for line in FAILING_STREAM + SUCCESS_STREAM:
        assert isinstance(json.loads(line), dict)


def _context(root, *, file_mode: int, mtime: int):
    """A build context as a checkout under some umask, at some time, leaves it."""
    (root / "wheels").mkdir(parents=True)
    files = {
        "Dockerfile": b"FROM scratch\nCOPY wheels /wheels\n",
        "wheels/numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl": b"PK wheel bytes",
        "entry.sh": b"#!/bin/sh\n",
        "secret.env": b"TOKEN=x\n",
        ".dockerignore": b"# keep secrets out\nsecret.env\nDockerfile\n",
    }
    for name, data in files.items():
        path = root / name
        path.write_bytes(data)
        path.chmod(file_mode | (0o111 if name == "entry.sh" else 0))
        os.utime(path, (mtime, mtime))
    return root


def _context_bytes(root, epoch):
    out = io.BytesIO()
    write_build_context(root, out, dockerfile="Dockerfile", source_date_epoch=epoch)
    return out.getvalue()


def test_build_context_bytes_do_not_depend_on_umask_or_checkout_time(tmp_path):
    epoch = 1735689600
    first = _context(tmp_path / "a", file_mode=0o644, mtime=epoch + 86400)
    second = _context(tmp_path / "b", file_mode=0o664, mtime=epoch + 7 * 86400)

    data = _context_bytes(first, epoch)

    assert data == _context_bytes(second, epoch)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    # .dockerignore wins over secret.env but never over the Dockerfile (as docker build).
    assert sorted(members) == [
        ".dockerignore",
        "Dockerfile",
        "entry.sh",
        "wheels",
        "wheels/numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl",
    ]
    assert list(members) == sorted(members)
    assert {m.mtime for m in members.values() if not m.isdir()} == {epoch}
    assert members["entry.sh"].mode == 0o755
    assert members["Dockerfile"].mode == 0o644
    assert {(m.uid, m.gid, m.uname) for m in members.values()} == {(0, 0, "")}


def test_build_context_keeps_older_mtimes_and_all_mtimes_without_an_epoch(tmp_path):
    root = _context(tmp_path / "c", file_mode=0o644, mtime=1000)

    with tarfile.open(fileobj=io.BytesIO(_context_bytes(root, 1735689600))) as tar:
        assert tar.getmember("Dockerfile").mtime == 1000
    with tarfile.open(fileobj=io.BytesIO(_context_bytes(root, None))) as tar:
        assert tar.getmember("entry.sh").mtime == 1000


def test_cell_run_flags_extend_a_request_and_stay_narrow():
    flags = RunFlags(
        devices=("/dev/kfd", "/dev/mkfd", "/dev/dri"),
        group_add=("video",),
        volumes=("/opt/hyhal:/opt/hyhal:ro",),
        shm_size="32g",
    )
    base = RunRequest(image="stackpin/dtk:stable", volumes=("/srv/models:/models:ro",))

    request = with_run_flags(base, flags)
    host = host_config_kwargs(request)

    assert request.devices == ("/dev/kfd", "/dev/mkfd", "/dev/dri")
    assert request.volumes == ("/srv/models:/models:ro", "/opt/hyhal:/opt/hyhal:ro")
    assert host["shm_size"] == "32g"
    assert host["group_add"] == ["video"]
    # Broad flags appear only when the cell opts in.
    assert "ipc_mode" not in host
    assert host["cap_add"] == []
    assert host["security_opt"] == []
    assert "privileged" not in host


class _PretendDaemon(http.server.BaseHTTPRequestHandler):
    """Answers the two calls DockerEngine.connect makes, like a daemon that then goes away."""

    def do_GET(self):
        body = {"/_ping": b"OK", "/version": json.dumps({"ApiVersion": "1.41"}).encode()}.get(
            self.path.split("?")[0].removeprefix("/v1.41"), b"{}"
        )
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self):  # unix sockets have no peer address
        return "unix"

    def log_message(self, *args):
        pass


def test_daemon_that_stops_mid_session_gives_the_same_one_line_error(tmp_path):
    sock = tmp_path / "docker.sock"
    server = socketserver.UnixStreamServer(str(sock), _PretendDaemon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    engine = DockerEngine.connect(environ={"DOCKER_HOST": f"unix://{sock}"}, timeout_s=5)
    server.shutdown()
    server.server_close()
    sock.unlink()

    with pytest.raises(HostEnvironmentError) as caught:
        engine.image_info("stackpin/base-bookworm:0123456789ab")

    assert caught.value.message.startswith(f"no Docker daemon answers at unix://{sock}: start one")


def test_the_pipeline_never_loads_the_docker_sdk():
    # Only the CLI and the transport reach a daemon; render is documented as pure.
    modules = ("render", "build", "rebuild", "normalize", "bootstrap", "bundle", "verification",
               "engine")
    code = (f"import sys\nfor m in {modules!r}: __import__('stackpin.' + m)\n"
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'docker', 'requests'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    with_transport = code.replace("for m in", "import stackpin.engine.docker_api\nfor m in")
    out = subprocess.run([sys.executable, "-c", with_transport], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "['docker', 'requests']"  # the witness can see the SDK


def test_unpacked_size_reads_the_containerd_listing_and_skips_attestations():
    # The shape Docker 28 (containerd image store) answers /images/json?manifests=1 with.
    image = {"Kind": "image", "Available": True, "Size": {"Content": 47_000_000},
             "ImageData": {"Size": {"Unpacked": 125_853_696}}}
    attestation = {"Kind": "attestation", "Available": True,
                   "AttestationData": {"For": "sha256:..."}, "Size": {"Content": 900}}
    absent = {**image, "Available": False}
    assert unpacked_size({"Size": 47_000_900, "Manifests": [image, attestation, absent]}) == (
        125_853_696)
    assert unpacked_size({"Size": 112_000_000}) == 0  # classic store: Size is unpacked already
