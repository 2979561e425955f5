"""A TCP proxy for the registry tests: a slow link that counts what it carries.

    python3 throttle.py LISTEN_PORT TARGET_PORT BYTES_PER_SECOND COUNT_FILE

Every connection to 127.0.0.1:LISTEN_PORT is forwarded to 127.0.0.1:TARGET_PORT; what
clients send is paced to BYTES_PER_SECOND in all (a site's slow link, so a test can stop a
push half-way) and counted: COUNT_FILE always holds the total client-to-server bytes so
far, so a test sees exactly how much a second push re-sent. Runs until killed.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from pathlib import Path

from stackpin.lock import write_text_atomic

CHUNK = 64 << 10


class Meter:
    def __init__(self, rate: int, count_file: Path) -> None:
        self.rate = rate
        self.count_file = count_file
        self.sent = 0
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def take(self, size: int) -> None:
        with self.lock:
            self.sent += size
            # Whole or not at all: write_text truncates first, and a test reading between the
            # truncation and the write saw an empty file (a local .ci/run, 2026-12-05).
            write_text_atomic(self.count_file, f"{self.sent}\n")
            due = self.started + self.sent / self.rate
        time.sleep(max(0.0, due - time.monotonic()))


def pipe(source: socket.socket, sink: socket.socket, meter: Meter | None) -> None:
    try:
        while data := source.recv(CHUNK):
            if meter is not None:
                meter.take(len(data))
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def main() -> None:
    listen, target, rate, count_file = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                        Path(sys.argv[4]))
    meter = Meter(rate, count_file)
    write_text_atomic(count_file, "0\n")
    server = socket.create_server(("127.0.0.1", listen))
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection(("127.0.0.1", target))
        threading.Thread(target=pipe, args=(client, upstream, meter), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client, None), daemon=True).start()


if __name__ == "__main__":
    main()
