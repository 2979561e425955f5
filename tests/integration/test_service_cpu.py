"""Unsloth Studio served from the CPU default image, driven over its HTTP API.

`stackpin serve` runs the built image's service on 127.0.0.1 with the tiny generated model
in the models folder; the tests log in with the bootstrap password, are forced to change
it, go through an API key's life (create, call, revoke, 401) and chat through the
OpenAI-style endpoint, plain and streamed (SSE). Bad input to `serve` leaves nothing
running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, ROOT
from tests.integration.loopback import (
    answering,
    free_port,
    outside_addresses,
    published_everywhere_answers,
)
from tests.tools import default_sigint

sys.path.insert(0, str(ROOT / "verify"))
from stackpin_verify.studio_api import Studio, StudioError

pytestmark = pytest.mark.docker

SERVE = [sys.executable, "-m", "stackpin.cli.main", "serve", CPU_CELL]
NEW_PASSWORD = "Stackpin-cpu-2026"


def _served_containers(state: Path) -> list[str]:
    """Containers `stackpin serve` started for this state folder (its label)."""
    done = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.stackpin.state={state.resolve()}"],
        capture_output=True, text=True, check=True)
    return done.stdout.split()


@dataclass
class Served:
    studio: Studio
    state: Path
    port: int
    output: list[str]


@pytest.fixture(scope="module")
def served(cpu_image, tiny_models: Path, tmp_path_factory) -> Iterator[Served]:
    state = tmp_path_factory.mktemp("studio-state")
    port = free_port()
    proc = subprocess.Popen(
        [*SERVE, "--port", str(port), "--models", str(tiny_models), "--state", str(state)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=default_sigint,  # Ctrl-C must reach serve even from a background runner
    )
    assert proc.stdout is not None
    output: list[str] = []
    try:
        for line in proc.stdout:
            output.append(line.rstrip())
            if "Ctrl-C stops it" in line:  # the last line serve prints once healthy
                break
        assert any("healthy at" in line for line in output), "\n".join(output[-40:])
        yield Served(studio=Studio(f"http://127.0.0.1:{port}"), state=state, port=port,
                     output=output)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: serve removes its container
        proc.wait(timeout=120)
    assert proc.returncode == 130
    assert _served_containers(state) == []


@pytest.fixture(scope="module")
def admin(served: Served) -> dict[str, object]:
    """Log in with the bootstrap password, then do the forced password change."""
    password_file = served.state / "studio" / "auth" / ".bootstrap_password"
    bootstrap = password_file.read_text().strip()
    seen: dict[str, object] = {"login": served.studio.login(bootstrap)}
    with pytest.raises(StudioError) as refused:
        served.studio.create_api_key("before-change")
    seen["before_change"] = refused.value
    old_token = served.studio.token
    seen["change"] = served.studio.change_password(bootstrap, NEW_PASSWORD)
    seen["bootstrap_left"] = password_file.exists()
    with pytest.raises(StudioError) as stale:
        served.studio.request("GET", "/api/auth/api-keys", token=old_token)
    seen["old_token"] = stale.value
    return seen


def test_serve_prints_the_url_and_the_bootstrap_password_file(served: Served):
    text = "\n".join(served.output)
    assert f"healthy at http://127.0.0.1:{served.port}/" in text
    assert f"password in {served.state / 'studio' / 'auth' / '.bootstrap_password'}" in text


def test_health_is_studios_json_published_on_loopback_only(served: Served):
    health = served.studio.health()
    assert health["status"] == "healthy"
    assert health["service"] == "Unsloth UI Backend"
    assert health["chat_only"] is True  # CPU: Train is greyed out in the UI
    (container,) = _served_containers(served.state)
    bindings = json.loads(subprocess.run(
        ["docker", "inspect", "--format", "{{json .HostConfig.PortBindings}}", container],
        capture_output=True, text=True, check=True).stdout)
    assert bindings == {"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(served.port)}]}
    # Asked of the network, not of the config: nothing answers beyond loopback.
    assert answering(served.port, ["127.0.0.1"]) == ["127.0.0.1"]
    assert answering(served.port, outside_addresses()) == []


def test_the_outside_probe_sees_a_port_published_on_every_interface(cpu_image):
    # Without this control, a probe that can never connect would pass the test above
    # for a service published on 0.0.0.0.
    seen = published_everywhere_answers(str(cpu_image["image_id"]), free_port(),
                                        name=f"stackpin-probe-{os.getpid()}")
    assert seen == outside_addresses()


def test_first_login_must_change_the_bootstrap_password(admin: dict[str, object]):
    assert admin["login"]["must_change_password"] is True  # type: ignore[index]
    before = admin["before_change"]
    assert isinstance(before, StudioError) and before.status == 403
    assert "Password change required" in str(before)
    assert admin["bootstrap_left"] is False  # Studio deletes the file after the change
    old = admin["old_token"]
    assert isinstance(old, StudioError) and old.status == 401


def test_api_key_create_call_revoke_then_401(served: Served, admin):
    key, key_id = served.studio.create_api_key("stackpin-test")
    assert key.startswith("sk-unsloth-")
    client = Studio(served.studio.base)
    models = client.request("GET", "/v1/models", token=key)
    assert models["object"] == "list"
    served.studio.revoke_api_key(key_id)
    with pytest.raises(StudioError) as revoked:
        client.request("GET", "/v1/models", token=key)
    assert revoked.value.status == 401


def test_chat_plain_and_streamed_with_the_tiny_model(served: Served, admin):
    model = "/workspace/models/tiny"
    assert served.studio.load_model(model)["status"] == "loaded"
    reply = served.studio.chat(model, "hello there", max_tokens=6)
    assert reply["object"] == "chat.completion"
    assert isinstance(reply["choices"][0]["message"]["content"], str)
    assert reply["usage"]["completion_tokens"] >= 1
    chunks = served.studio.chat_stream(model, "hello there", max_tokens=6)
    assert chunks, "no data: chunk before [DONE]"
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


# --- bad input: one line, the documented exit code, nothing left running ---------------


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVE, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ})


def test_serve_refuses_a_missing_models_folder(cpu_image, tmp_path):
    done = _serve("--models", str(tmp_path / "absent"), "--port", str(free_port()),
                  "--state", str(tmp_path / "state"))
    assert done.returncode == 3
    assert f"models folder {tmp_path / 'absent'} is missing" in done.stderr
    assert _served_containers(tmp_path / "state") == []


def test_serve_refuses_a_port_in_use(cpu_image, tiny_models, tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = _serve("--models", str(tiny_models), "--port", str(port),
                      "--state", str(tmp_path / "state"))
    assert done.returncode == 8
    assert f"port 127.0.0.1:{port} is taken" in done.stderr
    assert _served_containers(tmp_path / "state") == []
