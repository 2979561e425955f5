"""The docker-py transport: ``DockerEngine``, the only code of stackpin that talks to a daemon.

It takes the plain requests of ``stackpin.engine.types`` and returns plain results, never SDK
objects; the rest of stackpin sees it only through the ``stackpin.engine.Engine`` protocol.
Unit tests assert on the pure translations below (``container_kwargs``,
``host_config_kwargs``) and in ``docker_build``, so no test needs to patch the SDK.

Long operations (build, save, load) each get their own connection, closed when the
operation ends or is interrupted: closing it is what makes the daemon cancel a classic
build and remove its intermediate containers (``forcerm``) after Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Concatenate, ParamSpec, TypeVar

import docker
import docker.errors
import docker.types
import docker.utils
import requests
import urllib3.exceptions

# The types module as a namespace (as docker-py's api does with docker.types): the names
# are listed once, in the package face, not again here.
from stackpin.engine import types
from stackpin.engine.buildx import run_buildx
from stackpin.engine.docker_build import (
    BuildTally,
    build_failure,
    build_kwargs,
    finish_build_stream,
    tally_build_event,
    write_build_context,
)
from stackpin.errors import HostEnvironmentError

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
CONTAINER_PREFIX = "stackpin-"
# A RUN step or a multi-GB load can stay silent for minutes; the SDK's 60 s read timeout
# would cut it. Short calls (ping, inspect) keep the short timeout.
STREAM_TIMEOUT_S = 3600
_LOADED = re.compile(r"^Loaded image(?: ID)?: (\S+)$")
P = ParamSpec("P")
R = TypeVar("R")


def _ignore(_line: str) -> None:
    """Default progress sink."""


# --- containers ------------------------------------------------------------------------


def container_name() -> str:
    """A fresh name that marks the container as stackpin's (cleanup finds it by prefix)."""
    return f"{CONTAINER_PREFIX}{uuid.uuid4().hex}"


def host_config_kwargs(request: types.RunRequest) -> dict[str, Any]:
    """Arguments of the SDK's ``create_host_config`` for a run request."""
    binds = list(request.volumes) + [
        f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}" for m in request.mounts
    ]
    kwargs: dict[str, Any] = {
        "binds": binds,
        "devices": list(request.devices),
        "group_add": list(request.group_add),
        "cap_add": list(request.cap_add),
        "security_opt": list(request.security_opt),
        # Services may execute tools: publish on loopback only, never on every interface.
        "port_bindings": {p: ("127.0.0.1", h) for p, h in sorted(request.ports.items())},
    }
    optional = {
        "shm_size": request.shm_size,
        "ipc_mode": request.ipc_mode,
        "network_mode": request.network_mode,
    }
    kwargs.update({k: v for k, v in optional.items() if v})
    if request.gpus:
        kwargs["device_requests"] = [gpu_device_request(request.gpus)]
    if request.ulimits:
        kwargs["ulimits"] = [ulimit(text) for text in request.ulimits]
    return kwargs


def ulimit(text: str) -> docker.types.Ulimit:
    """``--ulimit`` semantics: NAME=SOFT[:HARD], the hard limit the soft one when absent."""
    name, _, limits = text.partition("=")
    soft, _, hard = limits.partition(":")
    return docker.types.Ulimit(name=name, soft=int(soft), hard=int(hard or soft))


def gpu_device_request(gpus: str) -> dict[str, Any]:
    """``--gpus`` semantics: "all", a count, or "device=0,1"."""
    if gpus == "all":
        return {"count": -1, "capabilities": [["gpu"]]}
    if gpus.isdigit():
        return {"count": int(gpus), "capabilities": [["gpu"]]}
    ids = gpus.removeprefix("device=").split(",")
    return {"device_ids": ids, "capabilities": [["gpu"]]}


def container_kwargs(request: types.RunRequest, name: str) -> dict[str, Any]:
    """Arguments of the SDK's ``create_container`` (without the host config)."""
    kwargs: dict[str, Any] = {
        "image": request.image,
        "name": name,
        "command": list(request.command) or None,
        "environment": dict(request.environment),
        "labels": dict(request.labels),
        "ports": sorted(request.ports),
    }
    if request.entrypoint is not None:
        kwargs["entrypoint"] = list(request.entrypoint)
    if request.user:
        kwargs["user"] = request.user
    if request.workdir:
        kwargs["working_dir"] = request.workdir
    return kwargs


class RunningContainer:
    """A started container inside ``DockerEngine.container``; removed when the block ends."""

    def __init__(self, *, api: docker.APIClient, container_id: str, name: str) -> None:
        self._api = api
        self.id = container_id
        self.name = name

    def wait(self, timeout_s: int) -> int | None:
        """Exit code, or None when it is still running after ``timeout_s``."""
        try:
            result = self._api.wait(self.id, timeout=timeout_s)
        except requests.exceptions.RequestException:
            return None
        return int(result["StatusCode"])

    def logs(self, *, stderr: bool = True) -> str:
        raw = self._api.logs(self.id, stdout=True, stderr=stderr)
        return bytes(raw).decode("utf-8", errors="replace")


def _no_daemon_message(url: str) -> str:
    return (
        f"no Docker daemon answers at {url}: start one "
        "(e.g. `dockerd &` as root, or `systemctl start docker`)"
    )


def _needs_daemon(
    method: Callable[Concatenate[DockerEngine, P], R],
) -> Callable[Concatenate[DockerEngine, P], R]:
    """A daemon that stops mid-session gets the same one-line error as one never started."""

    def call(self: DockerEngine, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except requests.exceptions.ConnectionError:
            raise HostEnvironmentError(_no_daemon_message(self.url)) from None

    call.__name__, call.__qualname__, call.__doc__ = (
        method.__name__, method.__qualname__, method.__doc__
    )
    return call


# --- the engine ------------------------------------------------------------------------


class DockerEngine:
    """A connection to one Docker daemon; every method takes or returns plain data."""

    def __init__(
        self, *, api: docker.APIClient, client_kwargs: Mapping[str, Any], url: str
    ) -> None:
        self._api = api
        self._client_kwargs = dict(client_kwargs)
        self.url = url

    @classmethod
    def connect(
        cls, *, environ: Mapping[str, str] | None = None, timeout_s: int = 60
    ) -> DockerEngine:
        """Connect as the docker CLI would (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH)."""
        env = dict(os.environ if environ is None else environ)
        kwargs: dict[str, Any] = dict(docker.utils.kwargs_from_env(environment=env))
        url = str(kwargs.get("base_url") or DEFAULT_DOCKER_HOST)
        try:
            # version=None asks the daemon for its API version: the first real round trip.
            api = docker.APIClient(**kwargs, timeout=timeout_s)
            api.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise HostEnvironmentError(_no_daemon_message(url), details=(str(exc),)) from None
        return cls(api=api, client_kwargs=kwargs, url=url)

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> DockerEngine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _streaming_client(self) -> Iterator[docker.APIClient]:
        api = docker.APIClient(
            **self._client_kwargs, version=self._api.api_version, timeout=STREAM_TIMEOUT_S
        )
        try:
            yield api
        finally:
            api.close()

    @_needs_daemon
    def version(self) -> types.EngineVersion:
        data = self._api.version()
        return types.EngineVersion(
            version=str(data.get("Version", "")),
            api_version=str(data.get("ApiVersion", "")),
            os=str(data.get("Os", "")),
            arch=str(data.get("Arch", "")),
            store=types.store_of(self._api.info()),
        )

    @_needs_daemon
    def report(self) -> types.EngineReport:
        """Version, store, cgroups, runtimes and security options, for `stackpin doctor`."""
        return types.engine_report(self.version(), self._api.info())

    # images ---------------------------------------------------------------------------

    @_needs_daemon
    def image_info(self, reference: str) -> types.ImageInfo | None:
        """The image a reference (name:tag, ID or name@digest) names here, or None."""
        try:
            data = self._api.inspect_image(reference)  # type: ignore[no-untyped-call]
            return types.image_info_from_inspect(data)
        except docker.errors.ImageNotFound:
            return None

    @_needs_daemon
    def image_record(self, reference: str) -> types.ImageRecord | None:
        """Config settings, platform, layers and history as the daemon records them."""
        try:
            data = self._api.inspect_image(reference)  # type: ignore[no-untyped-call]
            history = self._api.history(data["Id"])  # type: ignore[no-untyped-call]
        except docker.errors.ImageNotFound:
            return None
        return types.image_record_from(data, history)

    @_needs_daemon
    def list_images(self, label: str) -> list[types.ImageInfo]:
        """Every local image carrying ``label`` ("key" or "key=value"), newest first.

        ``size`` is the unpacked size on both stores: on the containerd image store the
        daemon's ``Size`` is the (compressed) content, so the unpacked size of each
        platform's snapshot is taken from the listing's manifests (API 1.47+).
        """
        # The SDK's images() cannot ask for manifests; older daemons ignore the parameter.
        url = f"{self._api.base_url}/v{self._api.api_version}/images/json"
        params = {"filters": json.dumps({"label": [label]}), "manifests": "1"}
        response = self._api.get(url, params=params)
        response.raise_for_status()
        summaries: list[dict[str, Any]] = response.json()
        found = []
        for summary in summaries:
            info = self.image_info(str(summary["Id"]))
            if info is not None:
                unpacked = types.unpacked_size(summary)
                found.append(replace(info, size=unpacked) if unpacked else info)
        return sorted(found, key=lambda i: (i.created, i.id), reverse=True)

    @_needs_daemon
    def tag(self, image: str, reference: str) -> None:
        repository, _, tag = reference.rpartition(":")
        if not repository or "/" in tag:  # "host:5000/name" has no tag part
            repository, tag = reference, "latest"
        self._api.tag(image, repository, tag, force=True)

    @_needs_daemon
    def remove_image(self, reference: str, *, force: bool = False) -> bool:
        """Remove an image; False when there was none."""
        try:
            self._api.remove_image(reference, force=force)
        except docker.errors.ImageNotFound:
            return False
        return True

    @_needs_daemon
    def pull(self, reference: str) -> types.ImageInfo:
        """Pull from a registry; a site without one is told to load a tar instead."""
        try:
            with self._streaming_client() as api:
                api.pull(reference)
        except docker.errors.APIError as exc:
            msg = (
                f"cannot pull {reference}: {_api_message(exc)}; on a host without registry "
                "access load it from a `docker save` tar (--base-tar)"
            )
            raise HostEnvironmentError(msg) from None
        return self._must_inspect(reference)

    def _must_inspect(self, reference: str) -> types.ImageInfo:
        info = self.image_info(reference)
        if info is None:
            msg = f"image {reference} vanished from the daemon right after it was created"
            raise HostEnvironmentError(msg)
        return info

    # build ----------------------------------------------------------------------------

    @_needs_daemon
    def build(
        self, request: types.BuildRequest, *, on_line: Callable[[str], None] = _ignore
    ) -> types.BuildResult:
        """Build, streaming each output line to ``on_line`` and to ``request.log_path``."""
        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        with request.log_path.open("w", encoding="utf-8") as log:

            def emit(lines: list[str]) -> None:
                for line in lines:
                    log.write(line + "\n")
                    log.flush()  # a crash or Ctrl-C keeps everything seen so far
                    on_line(line)

            if request.builder == "buildkit":
                return self._buildkit(request, emit)
            tally = self._stream_build(request, emit)
            tally, tail = finish_build_stream(tally)
            emit(tail)
        if tally.error:
            raise build_failure(tally, request.log_path)
        if not tally.image_id:
            tally = replace(tally, error="the daemon ended the stream without an image ID")
            raise build_failure(tally, request.log_path)
        for reference in request.tags:
            self.tag(tally.image_id, reference)
        return types.BuildResult(
            image_id=tally.image_id,
            tags=request.tags,
            log_path=request.log_path,
            steps=tally.steps,
            cached_steps=tally.cached_steps,
        )

    def _buildkit(
        self, request: types.BuildRequest, emit: Callable[[list[str]], None]
    ) -> types.BuildResult:
        outcome = run_buildx(request, docker_host=self.url, emit=lambda line: emit([line]),
                             load=lambda chunks: self.load(chunks).image_ids)
        for reference in request.tags:
            self.tag(outcome.image_id, reference)
        return types.BuildResult(
            image_id=outcome.image_id, tags=request.tags, log_path=request.log_path,
            steps=len(outcome.tally.steps), cached_steps=outcome.tally.cached_steps,
            builder="buildkit", native_timestamps=request.native_timestamps,
        )

    def _stream_build(
        self, request: types.BuildRequest, emit: Callable[[list[str]], None]
    ) -> BuildTally:
        tally = BuildTally()
        try:
            with tempfile.TemporaryFile() as context, self._streaming_client() as api:
                write_build_context(
                    request.context_dir,
                    context,
                    dockerfile=request.dockerfile,
                    source_date_epoch=request.source_date_epoch,
                )
                context.seek(0)
                for event in api.build(fileobj=context, **build_kwargs(request)):
                    tally, lines = tally_build_event(tally, event)
                    emit(lines)
                    if tally.error:
                        break
        except docker.errors.APIError as exc:  # refused before streaming (no Dockerfile...)
            tally = replace(tally, error=_api_message(exc))
            emit([f"ERROR: {tally.error}"])
        except requests.exceptions.RequestException as exc:
            tally = replace(tally, error=f"lost the Docker daemon mid-build ({exc})")
            emit([f"ERROR: {tally.error}"])
        return tally

    # containers -----------------------------------------------------------------------

    @contextlib.contextmanager
    def container(self, request: types.RunRequest) -> Iterator[RunningContainer]:
        """A started container, force-removed when the block ends, Ctrl-C included."""
        name = container_name()
        try:
            yield self._start(request, name)
        finally:
            # By name, not by ID: an interrupt can land after the daemon created the
            # container but before its ID reached us.
            with contextlib.suppress(docker.errors.NotFound):
                self._api.remove_container(name, force=True, v=True)

    @_needs_daemon
    def _start(self, request: types.RunRequest, name: str) -> RunningContainer:
        try:
            host_config = self._api.create_host_config(**host_config_kwargs(request))
            created = self._api.create_container(
                **container_kwargs(request, name), host_config=host_config
            )
            self._api.start(created["Id"])
        except docker.errors.APIError as exc:
            msg = f"the Docker daemon refused to run {request.image}: {_api_message(exc)}"
            raise HostEnvironmentError(msg) from None
        return RunningContainer(api=self._api, container_id=str(created["Id"]), name=name)

    def run_to_completion(self, request: types.RunRequest, *, timeout_s: int) -> types.RunResult:
        """Run a command to its end (or to ``timeout_s``) and collect its output."""
        with self.container(request) as running:
            code = running.wait(timeout_s)
            return types.RunResult(
                exit_code=-1 if code is None else code,
                timed_out=code is None,
                logs=running.logs(),
                stdout=running.logs(stderr=False),
            )


    # save / load -------------------------------------------------------------

    def save(self, request: types.SaveRequest) -> Iterator[bytes]:
        """The bytes of one ``docker save`` archive holding every requested image."""
        with self._streaming_client() as api:
            # The SDK's get_image takes one name; the API takes several, stored once.
            url = f"{api.base_url}/v{api.api_version}/images/get"
            params = [("names", name) for name in request.images]
            with api.get(url, params=params, stream=True) as response:
                if response.status_code != 200:
                    msg = (
                        f"the Docker daemon cannot save {', '.join(request.images)}: "
                        f"{response.text.strip()}; check the names with `stackpin images`"
                    )
                    raise HostEnvironmentError(msg)
                yield from _body(response, request.chunk_size)

    @_needs_daemon
    def load(self, source: Path | IO[bytes] | Iterable[bytes]) -> types.LoadResult:
        """``docker load`` from a file, a file object or an iterator of byte chunks."""
        with contextlib.ExitStack() as stack:
            data = stack.enter_context(source.open("rb")) if isinstance(source, Path) else source
            api = stack.enter_context(self._streaming_client())
            try:
                events = list(api.load_image(data))  # type: ignore[no-untyped-call]
            except docker.errors.APIError as exc:
                events = [{"error": _api_message(exc)}]
        references = _loaded_references(events)
        ids = tuple(self._must_inspect(r).id for r in references)
        return types.LoadResult(references=references, image_ids=ids)


def _body(response: requests.Response, size: int) -> Iterator[bytes]:
    """The body in chunks of ``size`` bytes. ``iter_content`` yields each 32 KiB HTTP chunk
    the daemon wrote: 2.9 CPU-s for 2 GiB against 1.1 here, and 64 times the hand-offs to
    the thread that parses the stream. A stream broken off is the daemon's error."""
    raw = response.raw
    try:
        while chunk := raw.read(size, decode_content=False):
            yield chunk
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        why = " ".join(str(exc).split())
        msg = (f"the Docker daemon's stream broke off ({why}); run the command again, and "
               "see the daemon's log if it happens again")
        raise HostEnvironmentError(msg) from None


def _loaded_references(events: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    references: list[str] = []
    for event in events:
        if "error" in event:
            msg = (
                f"the Docker daemon could not load the archive: {event['error']}; "
                "check it is a `docker save` tar (tar -tf shows manifest.json)"
            )
            raise HostEnvironmentError(msg)
        for line in str(event.get("stream", "")).splitlines():
            match = _LOADED.match(line.strip())
            if match:
                references.append(match.group(1))
    return tuple(references)


def _api_message(exc: docker.errors.APIError) -> str:
    return " ".join(str(exc.explanation or exc).split())
