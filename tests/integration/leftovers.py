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

import subprocess

TEST_PREFIX = "stackpin-test"


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300,
                          check=False)


def remove_test_images(prefix: str = TEST_PREFIX) -> list[str]:
    """Remove, from the engine DOCKER_HOST names, every image tagged ``prefix...`` and the
    containers made from it; returns those ``repository:tag`` references."""
    listed = _docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}")
    assert listed.returncode == 0, listed.stderr
    refs = sorted(ref for ref in listed.stdout.split() if ref.startswith(prefix))
    for ref in refs:
        containers = _docker("ps", "--all", "--quiet", "--filter", f"ancestor={ref}").stdout.split()
        if containers:
            _docker("rm", "--force", *containers)
        _docker("rmi", "--force", ref)
    return refs
