"""The one rule for tests that need a tool: skip on a developer's machine, fail in CI.

``scripts/setup-host.sh`` installs every tool a test uses, so under ``CI=true`` a missing
tool is a broken setup, and a test that skipped there would be a test that does not exist.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(what: str) -> NoReturn:
    """Fail under CI=true (setup should have installed it), skip elsewhere."""
    if in_ci():
        pytest.fail(f"CI=true but {what}: scripts/setup-host.sh must install it", pytrace=False)
    pytest.skip(what)


def need_tool(*names: str) -> str:
    """The path of the first of ``names`` on PATH."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    missing(f"{' or '.join(names)} is not installed")


def need_module(name: str) -> ModuleType:
    """A Python package the tests import (requirements-test.txt installs it)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"Python package {name} cannot be imported ({exc})")


def need_docker_plugin(plugin: str) -> str:
    """The docker CLI, with ``plugin`` (e.g. buildx) answering ``docker PLUGIN version``."""
    docker = need_tool("docker")
    done = subprocess.run([docker, plugin, "version"], capture_output=True, check=False)
    if done.returncode != 0:
        missing(f"docker {plugin} is not installed")
    return docker


def default_sigint() -> None:
    """preexec_fn for a child that must stop on Ctrl-C (SIGINT) as it does at a terminal.

    A runner started as a background job of a non-interactive shell inherits SIGINT
    ignored, and so would the child: Python then installs no KeyboardInterrupt handler.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
