"""The save stream as DockerEngine reads it off a real HTTP connection: whole chunks, and a
stream broken off named as the daemon's failure."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from stackpin.engine import SaveRequest
from stackpin.engine.docker_api import DockerEngine
from stackpin.errors import HostEnvironmentError

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")


def _serve(path: Path, body: bytes, *, finish: bool) -> threading.Thread:
    """One GET answered as the daemon does: 32 KiB HTTP chunks; ``finish``: the last one."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        connection, _ = server.accept()
        with connection, server:
            connection.recv(65536)
            connection.sendall(HEAD)
            for start in range(0, len(body), 32768):
                piece = body[start:start + 32768]
                connection.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            if finish:
                connection.sendall(b"0\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[DockerEngine, Path]]:
    path = tmp_path / "d.sock"
    url = f"unix://{path}"
    api = docker.APIClient(base_url=url, version="1.41")
    yield DockerEngine(api=api, client_kwargs={"base_url": url}, url=url), path
    api.close()


def test_the_save_comes_in_whole_chunks(engine):
    docker_engine, path = engine
    body = bytes(range(256)) * (3 * 4096 + 1)  # 3 MiB and 256 bytes
    thread = _serve(path, body, finish=True)
    chunks = list(docker_engine.save(SaveRequest(images=("x:1",))))
    thread.join()
    assert [len(c) for c in chunks] == [1 << 20] * 3 + [256]
    assert b"".join(chunks) == body


def test_a_save_broken_off_is_the_daemons_failure(engine):
    docker_engine, path = engine
    thread = _serve(path, b"y" * (2 << 20), finish=False)
    with pytest.raises(HostEnvironmentError, match="stream broke off"):
        list(docker_engine.save(SaveRequest(images=("x:1",))))
    thread.join()
