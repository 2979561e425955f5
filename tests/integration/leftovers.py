"""What a killed test run leaves on the default engine, given back before the next run.

Session fixtures remove their images at the end of the session; a run killed before then
(a CI timeout, ^C) leaves them tagged, and a CI machine keeps its Docker state. A fault image
is a child of the CPU image (the classic builder records the parent), so the next run of the
same commit, whose CPU image has the same ID, could not remove that image any more: Docker
only untags an image that has children. Every image a test tags is named ``stackpin-test...``
(the fault images ``stackpin-test-fault/``, the engine tests ``stackpin-test/``), and nothing
else is.
"""

from __future__ import annotations

import os
import subprocess

TEST_PREFIX = "stackpin-test"


def _docker(*args: str, host: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"DOCKER_HOST": host} if host else {})}
    return subprocess.run(["docker", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def tagged_references(prefix: str = TEST_PREFIX, *, host: str | None = None) -> list[str]:
    """Every ``repository:tag`` on the engine whose repository starts with ``prefix``."""
    listed = _docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", host=host)
    assert listed.returncode == 0, listed.stderr
    return sorted(ref for ref in listed.stdout.split() if ref.startswith(prefix))


def remove_test_images(prefix: str = TEST_PREFIX, *, host: str | None = None) -> list[str]:
    """Remove the containers and images of earlier runs' test tags; returns the tags."""
    refs = tagged_references(prefix, host=host)
    for ref in refs:
        containers = _docker("ps", "--all", "--quiet", "--filter", f"ancestor={ref}",
                             host=host).stdout.split()
        if containers:
            _docker("rm", "--force", *containers, host=host)
        _docker("rmi", "--force", ref, host=host)
    return refs
