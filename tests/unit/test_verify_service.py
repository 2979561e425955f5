"""L8 (the service level) and the Studio client, without a Studio: what they send and judge.

The real service is proved in the image (tests/integration/test_service_cpu.py and a
verify run); these tests pin the pieces and, above all, that a service which never gets
healthy, or exits, fails L8 instead of passing it.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import verify_helpers

from stackpin_verify import LEVELS, level8
from stackpin_verify.studio_api import Studio, StudioError, wait_healthy

SERVICE = {
    "argv": ["python", "/opt/stackpin/serve.py", "--host", "0.0.0.0", "--port", "8888",
             "--disable-tools"],
    "container_port": 8888,
    "state_dir": "/var/lib/stackpin/state",
    "ready_timeout": 3,
    "env": {"UNSLOTH_STUDIO_HOME": "/var/lib/stackpin/state/studio", "HF_HUB_OFFLINE": "1"},
}


def test_level8_is_registered():
    assert LEVELS[-1] == 8


def test_service_argv_binds_loopback_on_the_given_port():
    assert level8.service_argv(SERVICE, 43210) == [
        "python", "/opt/stackpin/serve.py", "--host", "127.0.0.1", "--port", "43210",
        "--disable-tools"]


def test_service_env_moves_state_paths_into_the_throwaway_folder(tmp_path: Path):
    env = level8.service_env(SERVICE, tmp_path)
    assert env["UNSLOTH_STUDIO_HOME"] == f"{tmp_path}/studio"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HOME"] == f"{tmp_path}/home"


def test_an_image_without_a_service_skips_level8():
    ctx = verify_helpers.cpu_context(image={**verify_helpers.image_info(), "service": None})
    (result,) = level8.run(ctx)
    assert (result.name, result.status) == ("L8.service.start", "skip")


@pytest.mark.parametrize("argv", [
    [sys.executable, "-c", "import time; time.sleep(30)"],  # never answers
    [sys.executable, "-c", "raise SystemExit(3)"],          # exits at once
])
def test_a_service_that_never_gets_healthy_fails_every_check(argv: list[str]):
    service = {**SERVICE, "argv": argv}
    ctx = verify_helpers.cpu_context(image={**verify_helpers.image_info(), "service": service})
    results = {r.name: r for r in level8.run(ctx)}
    assert {n: r.status for n, r in results.items()} == {
        "L8.service.start": "fail", "L8.service.login": "fail", "L8.service.chat": "fail"}
    assert "not healthy after 3s" in results["L8.service.start"].reason


# --- the client against a recorded Studio ------------------------------------------------


class _Recorded(BaseHTTPRequestHandler):
    # Set per test on a fresh subclass (the recorded fixture).
    answers: ClassVar[dict[tuple[str, str], tuple[int, Any, str]]]
    seen: ClassVar[list[tuple[str, str, str, Any]]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        type(self).seen.append((self.command, self.path,
                                self.headers.get("Authorization", ""), body))
        status, payload, kind = type(self).answers[(self.command, self.path)]
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.end_headers()
        self.wfile.write(payload if isinstance(payload, bytes) else json.dumps(payload).encode())

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def recorded() -> Iterator[tuple[Studio, type[_Recorded]]]:
    handler = type("Handler", (_Recorded,), {"answers": {}, "seen": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Studio(f"http://127.0.0.1:{server.server_address[1]}"), handler
    server.shutdown()
    server.server_close()


JSON = "application/json"


def test_login_then_password_change_carry_the_new_tokens(recorded):
    studio, handler = recorded
    handler.answers = {
        ("POST", "/api/auth/login"): (200, {"access_token": "t1", "must_change_password": True}, JSON),
        ("POST", "/api/auth/change-password"): (200, {"access_token": "t2"}, JSON),
    }
    studio.login("boot")
    studio.change_password("boot", "new")
    assert handler.seen[0][3] == {"username": "unsloth", "password": "boot"}
    assert handler.seen[1][2] == "Bearer t1"
    assert studio.token == "t2"


def test_an_http_error_carries_studios_status_and_detail(recorded):
    studio, handler = recorded
    handler.answers = {("GET", "/v1/models"): (401, {"detail": "Invalid or expired API key"}, JSON)}
    with pytest.raises(StudioError) as caught:
        studio.request("GET", "/v1/models", token="sk-unsloth-x")
    assert caught.value.status == 401
    assert "Invalid or expired API key" in str(caught.value)


def test_a_deferred_error_inside_a_200_body_is_an_error(recorded):
    studio, handler = recorded
    handler.answers = {("POST", "/api/inference/load"): (
        200, {"_deferred_error": {"status_code": 500, "detail": "load failed"}}, JSON)}
    with pytest.raises(StudioError, match="load failed"):
        studio.load_model("/workspace/models/tiny")


def test_a_stream_needs_event_stream_chunks_and_done(recorded):
    studio, handler = recorded
    chunk = {"object": "chat.completion.chunk", "choices": []}
    sse = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
    handler.answers = {("POST", "/v1/chat/completions"): (200, sse.encode(), "text/event-stream")}
    assert studio.chat_stream("m", "hi") == [chunk, chunk]
    handler.answers = {("POST", "/v1/chat/completions"): (
        200, f"data: {json.dumps(chunk)}\n\n".encode(), "text/event-stream")}
    with pytest.raises(StudioError, match=r"without data: \[DONE\]"):
        studio.chat_stream("m", "hi")
    handler.answers = {("POST", "/v1/chat/completions"): (200, {"object": "x"}, JSON)}
    with pytest.raises(StudioError, match="not an event stream"):
        studio.chat_stream("m", "hi")


def test_wait_healthy_gives_up_with_the_last_reason(recorded):
    studio, handler = recorded
    handler.answers = {("GET", "/api/health"): (200, {"status": "starting"}, JSON)}
    with pytest.raises(StudioError, match="status 'starting'"):
        wait_healthy(studio, 1.5)
