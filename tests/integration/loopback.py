"""Is a published port reachable from anywhere but loopback? Probed, not read from config.

``docker inspect``'s PortBindings says what was asked for; these helpers ask the network.
A port published on every interface answers on the Docker bridge's gateway address and on
the host's default-route address; one published on 127.0.0.1 answers on neither.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def outside_addresses() -> list[str]:
    """This host's own IPv4 addresses that are not loopback (bridge gateway, route source)."""
    found = set(subprocess.run(
        ["docker", "network", "inspect", "bridge", "--format",
         "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
        capture_output=True, text=True, check=True).stdout.split())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:  # a UDP connect sends nothing; it only picks the source address of the route
            probe.connect(("192.0.2.1", 9))
            found.add(probe.getsockname()[0])
        except OSError:
            pass
    addresses = sorted(a for a in found if a and not a.startswith("127."))
    assert addresses, "no non-loopback address to probe from"
    return addresses


def answering(port: int, addresses: list[str]) -> list[str]:
    """The addresses on which something accepts a TCP connection to ``port``."""
    accepted = []
    for address in addresses:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(3.0)
            if probe.connect_ex((address, port)) == 0:
                accepted.append(address)
    return accepted


def published_everywhere_answers(image: str, port: int, name: str) -> list[str]:
    """Control for the probe: a port published on all interfaces must be seen from outside.

    Runs a plain HTTP server from ``image`` on 0.0.0.0:``port`` and returns the outside
    addresses that accept it (empty would mean the probe cannot tell loopback from not).
    """
    subprocess.run(["docker", "run", "--detach", "--rm", "--name", name, "--network", "bridge",
                    "--publish", f"0.0.0.0:{port}:8000", "--entrypoint", "python", image,
                    "-m", "http.server", "8000"], capture_output=True, text=True, check=True)
    try:
        addresses = outside_addresses()
        for _ in range(60):
            seen = answering(port, addresses)
            if seen:
                return seen
            time.sleep(1)
        return []
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def netns(engine_name: str) -> list[str]:
    """The command prefix that runs a program in an engine's network namespace.

    Each engine beside the default one lives in its own namespace, /run/netns/stackpin-NAME
    (the matrix engines of scripts/setup-engines.sh, Podman's made by its test): its
    published 127.0.0.1 ports are that namespace's loopback, as on a host whose only engine
    it is. The engine's socket is a file, reachable from any namespace; the namespace has no
    route out, so what needs the network (fetching wheels, bootstrapping a base) runs
    outside it.
    """
    return ["nsenter", f"--net=/run/netns/stackpin-{engine_name}"]


def get_json_in_netns(engine_name: str, url: str) -> dict[str, object]:
    """GET ``url`` from inside the engine's network namespace and parse the JSON answer."""
    done = subprocess.run(
        [*netns(engine_name), "python3", "-c",
         "import sys, urllib.request; "
         "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())", url],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer
