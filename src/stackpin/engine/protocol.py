"""The one engine protocol that build, rebuild, normalise, bundle and verification take.

``stackpin.engine.docker_api.DockerEngine`` implements it against a daemon; the unit tests'
shared fake implements it in memory. Every argument and result is a plain type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Protocol

# The types module as a namespace (as docker-py's api does with docker.types): the names
# are listed once, in the package face, not again here.
import stackpin.engine.types as types


class Running(Protocol):
    """A started container inside ``Engine.container``: removed when the block ends."""

    id: str

    def wait(self, timeout_s: int) -> int | None:
        """Exit code, or None when it is still running after ``timeout_s``."""

    def logs(self, *, stderr: bool = True) -> str: ...


class Engine(Protocol):
    """One container engine: images, builds, runs, and ``docker save``/``load`` streams."""

    def version(self) -> types.EngineVersion: ...

    def report(self) -> types.EngineReport:
        """Version, store, cgroups, runtimes and security options (doctor, the builder)."""

    def image_info(self, reference: str) -> types.ImageInfo | None:
        """The image a reference (name:tag, ID or name@digest) names, or None."""

    def image_record(self, reference: str) -> types.ImageRecord | None:
        """The daemon's record of an image's config and history (no save), or None."""

    def list_images(self, label: str) -> list[types.ImageInfo]:
        """Every local image carrying ``label`` ("key" or "key=value"), newest first."""

    def tag(self, image: str, reference: str) -> None: ...

    def remove_image(self, reference: str, *, force: bool = False) -> bool:
        """Remove an image or a tag; False when there was none."""

    def pull(self, reference: str) -> types.ImageInfo: ...

    def build(
        self, request: types.BuildRequest, *, on_line: Callable[[str], None] = ...
    ) -> types.BuildResult: ...

    def run_to_completion(
        self, request: types.RunRequest, *, timeout_s: int
    ) -> types.RunResult: ...

    def container(self, request: types.RunRequest) -> AbstractContextManager[Running]:
        """A started container, force-removed when the block ends, Ctrl-C included."""

    def save(self, request: types.SaveRequest) -> Iterator[bytes]:
        """The bytes of one ``docker save`` archive holding every requested image."""

    def load(self, source: Path | IO[bytes] | Iterable[bytes]) -> types.LoadResult: ...
