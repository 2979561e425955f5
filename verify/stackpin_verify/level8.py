"""L8 service: the image's own service (Unsloth Studio) starts, answers healthy, lets the
bootstrap user in (forced password change) and chats once with the tiny generated model.

Everything comes from the image's service declaration (image.json "service"): the argv,
the health path and the start bound. The service runs as a child with a throw-away state
folder and a free loopback port, offline, and is stopped (its whole process group) after
the last check. An image that declares no service skips this level.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackpin_verify import tinychat
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, run_check
from stackpin_verify.context import Context
from stackpin_verify.studio_api import Studio, StudioError, wait_healthy

MODEL = "tiny"


@dataclass
class Running:
    studio: Studio
    state: Path
    models: Path
    log: Path
    started_s: float
    healthy_s: float = 0.0


def run(ctx: Context) -> list[CheckResult]:
    service = (ctx.image or {}).get("service")
    if not service:
        reason = "the image declares no service"
        return [run_check("L8.service.start", functools.partial(_skip, reason))]
    with _service(service) as running:
        return [
            run_check("L8.service.start", functools.partial(check_start, running, service)),
            run_check("L8.service.login", functools.partial(check_login, running)),
            run_check("L8.service.chat", functools.partial(check_chat, running)),
        ]


def _skip(reason: str) -> Metrics:
    raise Skip(reason)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def service_argv(service: dict[str, Any], port: int) -> list[str]:
    """The declared argv, bound to loopback on ``port`` instead of the container port."""
    argv = [str(a) for a in service["argv"]]
    inner = str(service["container_port"])
    argv = [str(port) if a == inner else a for a in argv]
    return ["127.0.0.1" if a == "0.0.0.0" else a for a in argv]


def service_env(service: dict[str, Any], state: Path) -> dict[str, str]:
    """The image's environment with every state path moved into ``state``."""
    env = dict(os.environ)
    declared = str(service["state_dir"])
    for key, value in dict(service.get("env") or {}).items():
        env[key] = str(value).replace(declared, str(state))
    env["HOME"] = str(state / "home")
    return env


@contextmanager
def _service(service: dict[str, Any]) -> Iterator[Running]:
    with tempfile.TemporaryDirectory(prefix="stackpin-l8-") as tmp:
        state, models = Path(tmp) / "state", Path(tmp) / "models"
        (state / "home").mkdir(parents=True)
        port = free_port()
        log = Path(tmp) / "service.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                service_argv(service, port), env=service_env(service, state), cwd=state,
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                yield Running(Studio(f"http://127.0.0.1:{port}"), state, models, log,
                              time.perf_counter())
            finally:
                _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # Studio spawns inference and training workers: end the whole group, gently first.
    with_group = [signal.SIGTERM, signal.SIGKILL]
    for sig in with_group:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


def _log_tail(running: Running, lines: int = 5) -> str:
    text = running.log.read_text(encoding="utf-8", errors="replace")
    return " | ".join(text.strip().splitlines()[-lines:])


def check_start(running: Running, service: dict[str, Any]) -> Metrics:
    try:
        health = wait_healthy(running.studio, float(service["ready_timeout"]))
    except StudioError as exc:
        msg = f"{exc}; log: {_log_tail(running)}"
        raise CheckFailed(msg) from None
    running.healthy_s = time.perf_counter() - running.started_s
    return {"start_s": round(running.healthy_s, 2), "service": str(health.get("service"))}


def check_login(running: Running) -> Metrics:
    if not running.healthy_s:
        msg = "the service never got healthy (L8.service.start)"
        raise CheckFailed(msg)
    password_file = running.state / "studio" / "auth" / ".bootstrap_password"
    bootstrap = password_file.read_text(encoding="utf-8").strip()
    answer = running.studio.login(bootstrap)
    if answer.get("must_change_password") is not True:
        msg = "the bootstrap login did not demand a password change"
        raise CheckFailed(msg)
    # A fresh throw-away password: the account lives only in this run's state folder.
    running.studio.change_password(bootstrap, f"L8-{secrets.token_hex(8)}")
    if password_file.exists():
        msg = "the bootstrap password file is still there after the change"
        raise CheckFailed(msg)
    return {}


def check_chat(running: Running) -> Metrics:
    if not running.studio.token:
        msg = "not logged in (L8.service.login)"
        raise CheckFailed(msg)
    folder = tinychat.write_model(running.models / MODEL)
    start = time.perf_counter()
    running.studio.load_model(str(folder))
    loaded = time.perf_counter()
    reply = running.studio.chat(str(folder), "hello", max_tokens=4)
    if reply.get("object") != "chat.completion" or not reply.get("choices"):
        msg = f"not a chat completion: {str(reply)[:200]}"
        raise CheckFailed(msg)
    return {"load_s": round(loaded - start, 2), "chat_s": round(time.perf_counter() - loaded, 2)}
