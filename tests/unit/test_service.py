"""The service declaration: defaults from the seed, rules, and what the Dockerfile gets from it."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import tomllib
from tests.conftest import CPU_CELL, ROOT
from tests.unit.test_matrix import MINIMAL

from stackpin.context import read_sources
from stackpin.lock import read_lock
from stackpin.matrixfile import decode_matrix, decode_matrix_lenient
from stackpin.render import RenderRequest, render
from stackpin.servicespec import SERVICE_ENV


def _cell(extra: str = "[cells.c1.service]\n"):
    return decode_matrix(tomllib.loads(MINIMAL + extra), source="t.toml").cells["c1"]


def _problems(extra: str) -> list[str]:
    _, problems = decode_matrix_lenient(tomllib.loads(MINIMAL + extra))
    return [str(p) for p in problems]


def test_a_cell_without_a_service_table_serves_nothing():
    assert decode_matrix(tomllib.loads(MINIMAL), source="t.toml").cells["c1"].service is None


def test_defaults_follow_the_seed_ports_and_tools():
    service = _cell().service
    assert service is not None
    assert (service.stable.port, service.stable.tools) == (18888, False)
    assert (service.enhanced.port, service.enhanced.tools) == (18887, True)
    assert service.health_path == "/api/health"
    assert service.models_dir == "/workspace/models"
    assert service.argv("stable")[-1] == "--disable-tools"
    assert service.argv("enhanced")[-1] == "--enable-tools"
    assert "8888" in service.argv("stable")


def test_service_env_starts_from_the_offline_switches_and_fills_the_state_dir():
    service = _cell('[cells.c1.service]\nenv = { EXTRA = "{state_dir}/x", HF_HUB_OFFLINE = "1" }\n'
                    ).service
    assert service is not None
    env = service.environment()
    assert env["EXTRA"] == "/var/lib/stackpin/state/x"
    assert env["UNSLOTH_STUDIO_HOME"] == "/var/lib/stackpin/state/studio"
    assert {k: env[k] for k in SERVICE_ENV if "{" not in SERVICE_ENV[k]} == {
        k: v for k, v in SERVICE_ENV.items() if "{" not in v
    }
    assert env["UNSLOTH_DISABLE_DIFFUSERS_AUTOREPAIR"] == "1"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("container_port = 0", "service.container_port: 0 is not a port"),
        ("stable = { port = 70000, tools = false }", "service.stable.port: 70000 is not a port"),
        ("enhanced = { port = 18888, tools = true }", "need different host ports"),
        ('health_path = "api/health"', "service.health_path: must start with '/'"),
        ("ready_timeout = 0", "service.ready_timeout: must be at least 1 second"),
        ('models_dir = "models"', "service.models_dir: must be an absolute container path"),
        ("command = []", "service.command: give the service's argv"),
        ("stable = { port = 1 }", "service.stable.tools: required key is missing"),
        ('tools = "on"', "service.tools: unknown key"),
    ],
)
def test_service_rules(extra: str, expected: str):
    problems = _problems(f"[cells.c1.service]\n{extra}\n")
    assert any(expected in p for p in problems), problems


def _render(cell, variant="stable"):
    return render(RenderRequest(
        cell=cell, variant=variant, lock=None, sources=read_sources(ROOT / "templates"),
        stackpin_version="0.1.0",
    ))


def test_dockerfile_gets_expose_healthcheck_and_cmd_from_the_declaration():
    text = _render(_cell('[cells.c1.service]\ncontainer_port = 9999\nready_timeout = 77\n'
                         'health_path = "/up"\n')).dockerfile
    assert "EXPOSE 9999\n" in text
    assert "--start-period=77s" in text
    # Through the entrypoint: the check runs where the service runs (env script sourced).
    assert ('CMD ["/opt/stackpin/entrypoint.sh", "python", "/opt/stackpin/healthcheck.py", '
            '"http://127.0.0.1:9999/up"]') in text
    assert ('CMD ["python", "/opt/stackpin/serve.py", "--host", "0.0.0.0", "--port", "9999", '
            '"--disable-tools"]') in text
    assert "stackpin_verify" not in text.split("ENTRYPOINT")[1]


def test_a_cell_without_service_keeps_the_verify_cmd_and_no_healthcheck():
    rendered = _render(decode_matrix(tomllib.loads(MINIMAL), source="t.toml").cells["c1"])
    assert "HEALTHCHECK" not in rendered.dockerfile
    assert "EXPOSE" not in rendered.dockerfile
    assert "stackpin/serve.py" not in rendered.files


def test_service_files_and_image_info_travel_in_the_context():
    rendered = _render(_cell())
    assert {"stackpin/serve.py", "stackpin/healthcheck.py"} <= set(rendered.files)
    info = json.loads(rendered.files["stackpin/image.json"])
    assert info["service"]["host_port"] == 18888
    assert info["service"]["tools"] is False
    assert info["service"]["env"]["HF_HUB_OFFLINE"] == "1"
    assert "UNSLOTH_DISABLE_DIFFUSERS_AUTOREPAIR=\"1\"" in rendered.dockerfile


def test_the_cpu_cell_serves_studio_on_the_seed_port(shipped_cells):
    cell = shipped_cells[CPU_CELL]
    assert cell.service is not None
    assert cell.service.environment()["UNSLOTH_DISABLE_CPU_FALLBACK"] == "0"
    rendered = render(RenderRequest(
        cell=cell, variant="stable", lock=read_lock(ROOT, CPU_CELL),
        sources=read_sources(ROOT / "templates"), stackpin_version="0.1.0",
    ))
    assert json.loads(rendered.files["stackpin/image.json"])["service"]["host_port"] == 18888


# --- the in-image health check, run as the image runs it ------------------------------


class _Answer(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[tuple[HTTPServer, type[_Answer]]]:
    handler = type("Handler", (_Answer,), {})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"status":"healthy","service":"Unsloth UI Backend"}', 0),
        (b'{"status":"starting"}', 1),
        (b"<html>ok</html>", 1),
        (b"[1, 2]", 1),
    ],
)
def test_healthcheck_needs_a_healthy_json_status(answering, body: bytes, code: int):
    server, handler = answering
    handler.body = body
    url = f"http://127.0.0.1:{server.server_address[1]}/api/health"
    done = subprocess.run([sys.executable, str(ROOT / "src" / "stackpin" / "healthcheck.py"), url],
                          capture_output=True, text=True, check=False)
    assert done.returncode == code, done.stdout + done.stderr


def test_healthcheck_of_a_closed_port_fails():
    with HTTPServer(("127.0.0.1", 0), _Answer) as server:
        port = server.server_address[1]
    done = subprocess.run([sys.executable, str(ROOT / "src" / "stackpin" / "healthcheck.py"),
                           f"http://127.0.0.1:{port}/api/health"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "no answer" in done.stdout


def test_serve_launcher_says_in_one_line_when_studio_is_missing(tmp_path):
    done = subprocess.run([sys.executable, "-S", str(ROOT / "templates" / "serve.py")],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1
    assert "Unsloth Studio" in done.stderr


# --- `stackpin serve` on a fake engine: what it prints and refuses, without Docker -------


class _FakeRunning:
    id = "c0ffee"

    def wait(self, timeout_s: int) -> int | None:
        # Running during start (serve polls with 1 s); "exits on its own" once serve waits
        # for it in the foreground.
        return None if timeout_s <= 1 else 0

    def logs(self) -> str:
        return "studio: bye"


class _FakeEngine:
    """Records what serve asks; its container is a real HTTP server on the published port."""

    def __init__(self, *, built: bool, body: bytes) -> None:
        self.built, self.body, self.started = built, body, []

    def __enter__(self) -> _FakeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def image_info(self, image: str) -> object | None:
        return object() if self.built else None

    @contextlib.contextmanager
    def container(self, request) -> Iterator[_FakeRunning]:  # type: ignore[no-untyped-def]
        self.started.append(request)
        (port,) = request.ports.values()
        handler = type("Handler", (_Answer,), {"body": self.body})
        with HTTPServer(("127.0.0.1", port), handler) as server:
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            try:
                yield _FakeRunning()
            finally:
                server.shutdown()


def _serve(monkeypatch, tmp_path, engine: _FakeEngine, *args: str):
    from click.testing import CliRunner

    from stackpin.cli import common
    from stackpin.cli.main import cli

    monkeypatch.setattr(common.ENGINE, "factory", lambda: engine)
    monkeypatch.chdir(ROOT)
    (tmp_path / "models").mkdir(exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(cli, ["serve", *args, "--port", str(port), "--models",
                                      str(tmp_path / "models"), "--state", str(tmp_path / "s")])
    return result, port


def test_serve_json_prints_one_json_line_once_healthy(monkeypatch, tmp_path):
    engine = _FakeEngine(built=True, body=b'{"status":"healthy"}')
    result, port = _serve(monkeypatch, tmp_path, engine, CPU_CELL, "--json")
    first, *rest = result.stdout.splitlines()
    seen = json.loads(first)
    assert seen["url"] == f"http://127.0.0.1:{port}/"
    assert seen["health_url"] == f"http://127.0.0.1:{port}/api/health"
    assert (seen["port"], seen["container"], seen["cell"]) == (port, "c0ffee", CPU_CELL)
    assert seen["password_file"] is None  # the fake wrote none
    assert rest == []  # nothing but the JSON line on stdout
    # The fake service then exits on its own: exit 6 with its log, the container removed.
    assert result.exit_code == 6
    assert "exited on its own with code 0" in result.stderr
    (request,) = engine.started
    assert request.ports == {8888: port}


def test_serve_of_an_image_that_is_not_built_is_exit_8_with_the_build_command(
        monkeypatch, tmp_path):
    engine = _FakeEngine(built=False, body=b"")
    result, _port = _serve(monkeypatch, tmp_path, engine, CPU_CELL)
    assert result.exit_code == 8
    assert result.stderr.count("\n") == 1
    assert f"is not built: run 'stackpin build {CPU_CELL} --variant stable'" in result.stderr
    assert engine.started == []


def test_serve_does_not_take_a_200_that_is_not_healthy_json(monkeypatch, tmp_path):
    engine = _FakeEngine(built=True, body=b"<html>it works</html>")
    result, _port = _serve(monkeypatch, tmp_path, engine, CPU_CELL, "--timeout", "2")
    assert result.exit_code == 6
    assert "not healthy after 2s" in result.stderr and "not a JSON object" in result.stderr
    assert "healthy at" not in result.stdout


@pytest.mark.parametrize(("args", "code", "words"), [
    (("no-such-cell",), 3, "no-such-cell"),
    ((CPU_CELL, "--variant", "enhanced"), 3, "enhanced"),
])
def test_serve_refuses_a_wrong_cell_or_variant_before_docker(monkeypatch, tmp_path, args, code,
                                                            words):
    engine = _FakeEngine(built=True, body=b"")
    result, _port = _serve(monkeypatch, tmp_path, engine, *args)
    assert result.exit_code == code, result.output
    assert result.stderr.count("\n") == 1 and words in result.stderr
    assert engine.started == []
