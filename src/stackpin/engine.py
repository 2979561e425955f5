"""The Docker engine boundary: the only module of stackpin that imports the Docker SDK.

Everything else builds small frozen request objects (``BuildRequest``, ``RunRequest``,
``SaveRequest``, ``ImportRequest``) and hands them to an ``Engine``; unit tests assert on
those objects and on the pure translation functions below (``build_kwargs``,
``container_kwargs``, ``host_config_kwargs``, ``parse_build_stream``), so no test needs
to patch the SDK. Results come back as plain dataclasses, never as SDK objects.

Long operations (build, save, load, import) each get their own connection, closed when
the operation ends or is interrupted: closing it is what makes the daemon cancel a
classic build and remove its intermediate containers (``forcerm``) after Ctrl-C.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Concatenate, ParamSpec, TypeVar

import docker
import docker.errors
import docker.utils
import docker.utils.build
import requests

from stackpin.errors import BuildError, HostEnvironmentError
from stackpin.matrix import RunFlags

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
CONTAINER_PREFIX = "stackpin-"
# A RUN step or a multi-GB load can stay silent for minutes; the SDK's 60 s read timeout
# would cut it. Short calls (ping, inspect) keep the short timeout.
STREAM_TIMEOUT_S = 3600
_STEP_LINE = re.compile(r"^Step \d+/\d+ : ")
_CACHE_HIT = "---> Using cache"
_LOADED = re.compile(r"^Loaded image(?: ID)?: (\S+)$")
P = ParamSpec("P")
R = TypeVar("R")


def _ignore(_line: str) -> None:
    """Default progress sink."""


# --- requests ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """One classic-builder build of a context directory."""

    context_dir: Path
    dockerfile: str = "Dockerfile"
    tags: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    buildargs: Mapping[str, str] = field(default_factory=dict)
    # "none" makes every RUN step offline: the classic builder runs them in that network.
    network_mode: str | None = None
    nocache: bool = False
    pull: bool = False
    rm: bool = True
    forcerm: bool = True
    log_path: Path
    # Context file mtimes are clamped to this (as SOURCE_DATE_EPOCH tools do); None keeps them.
    source_date_epoch: int | None = None


@dataclass(frozen=True, kw_only=True)
class BindMount:
    """A host directory mounted into a container (e.g. where reports are written)."""

    source: Path
    target: str
    read_only: bool = False


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """One container run; the broad flags (ipc host, caps, seccomp) are explicit opt-ins."""

    image: str
    command: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    group_add: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()  # "host:container[:ro]", as the cell's run flags write them
    mounts: tuple[BindMount, ...] = ()
    shm_size: str = ""
    gpus: str = ""  # "all", a count, or "device=0,1"; empty = no GPU request
    ipc_mode: str = ""
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()
    network_mode: str = ""
    ports: Mapping[int, int] = field(default_factory=dict)  # container port -> 127.0.0.1 port
    user: str = ""
    workdir: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SaveRequest:
    """Several images written as ONE ``docker save`` stream (shared layers stored once)."""

    images: tuple[str, ...]
    chunk_size: int = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ImportRequest:
    """A rootfs tar imported as a one-layer image (``docker import``)."""

    tar_path: Path
    repository: str
    tag: str
    changes: tuple[str, ...] = ()


# --- results ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    log_path: Path
    steps: int
    cached_steps: int


@dataclass(frozen=True, kw_only=True)
class RunResult:
    exit_code: int  # -1 when the run timed out
    timed_out: bool
    logs: str  # stdout and stderr interleaved as the daemon recorded them
    stdout: str


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    references: tuple[str, ...]  # "repo:tag", or "sha256:..." for untagged images
    image_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    labels: Mapping[str, str]
    size: int
    created: str
    env: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    diff_ids: tuple[str, ...]
    architecture: str
    os: str


@dataclass(frozen=True, kw_only=True)
class EngineVersion:
    version: str
    api_version: str
    os: str
    arch: str


def image_info_from_inspect(data: Mapping[str, Any]) -> ImageInfo:
    """ImageInfo from the daemon's ``/images/<id>/json`` document."""
    config = data.get("Config") or {}
    return ImageInfo(
        id=str(data["Id"]),
        tags=tuple(data.get("RepoTags") or ()),
        repo_digests=tuple(data.get("RepoDigests") or ()),
        labels=dict(config.get("Labels") or {}),
        size=int(data.get("Size") or 0),
        created=str(data.get("Created") or ""),
        env=tuple(config.get("Env") or ()),
        entrypoint=tuple(config.get("Entrypoint") or ()),
        cmd=tuple(config.get("Cmd") or ()),
        diff_ids=tuple((data.get("RootFS") or {}).get("Layers") or ()),
        architecture=str(data.get("Architecture") or ""),
        os=str(data.get("Os") or ""),
    )


def digest_matches(info: ImageInfo, pinned: str) -> bool:
    """Whether a pinned ``sha256:`` is this image's ID or one of its registry digests.

    A base loaded from a ``docker save`` tar has no RepoDigests (load drops them), so the
    image ID (the config digest) is what an air-gapped site pins.
    """
    registry = {d.rpartition("@")[2] for d in info.repo_digests}
    return pinned == info.id or pinned in registry


# --- build output: a pure fold over the daemon's JSON events -------------------------


@dataclass(frozen=True, kw_only=True)
class BuildTally:
    """What a build stream said so far."""

    steps: int = 0
    cached_steps: int = 0
    current_step: str = ""
    image_id: str = ""
    error: str = ""
    partial: str = ""  # text after the last newline, completed by the next event


def tally_build_event(tally: BuildTally, event: Mapping[str, Any]) -> tuple[BuildTally, list[str]]:
    """Fold one decoded daemon event into the tally; return it and the complete lines."""
    if "error" in event:
        message = str(event.get("error") or (event.get("errorDetail") or {}).get("message", ""))
        return replace(tally, error=" ".join(message.split()) or "unknown error"), [
            f"ERROR: {message.strip()}"
        ]
    aux = event.get("aux")
    if isinstance(aux, Mapping) and "ID" in aux:
        tally = replace(tally, image_id=str(aux["ID"]))
    if "stream" in event:
        text = tally.partial + str(event["stream"])
        *lines, partial = text.split("\n")
        tally = replace(tally, partial=partial)
        for line in lines:
            tally = _count_line(tally, line)
        return tally, lines
    if "status" in event and "progress" not in event:
        return tally, [" ".join(str(event[k]) for k in ("id", "status") if event.get(k))]
    return tally, []


def _count_line(tally: BuildTally, line: str) -> BuildTally:
    stripped = line.strip()
    if _STEP_LINE.match(stripped):
        return replace(tally, steps=tally.steps + 1, current_step=stripped)
    if stripped.startswith(_CACHE_HIT):
        return replace(tally, cached_steps=tally.cached_steps + 1)
    return tally


def finish_build_stream(tally: BuildTally) -> tuple[BuildTally, list[str]]:
    """Flush the last unterminated line, if any."""
    if not tally.partial:
        return tally, []
    line = tally.partial
    return _count_line(replace(tally, partial=""), line), [line]


def parse_build_stream(json_lines: Iterable[str]) -> BuildTally:
    """The tally of a whole saved stream of JSON lines (what the daemon sends)."""
    tally = BuildTally()
    for raw in json_lines:
        if raw.strip():
            tally, _ = tally_build_event(tally, json.loads(raw))
    return finish_build_stream(tally)[0]


def build_failure(tally: BuildTally, log_path: Path) -> BuildError:
    """The one-line error for a failed build: the failing step, the reason and the log."""
    step = tally.current_step or "before the first step (context or Dockerfile)"
    return BuildError(
        f"build failed at {step}: {tally.error}; full log: {log_path}",
        step=tally.current_step,
        log_path=str(log_path),
    )


def build_kwargs(request: BuildRequest) -> dict[str, Any]:
    """Arguments of the SDK's low-level build call for a request."""
    return {
        # stackpin writes the context tar itself (write_build_context), not the SDK.
        "custom_context": True,
        "dockerfile": request.dockerfile,
        "labels": dict(request.labels),
        "buildargs": dict(request.buildargs),
        "network_mode": request.network_mode,
        "nocache": request.nocache,
        "pull": request.pull,
        "rm": request.rm,
        "forcerm": request.forcerm,
        "decode": True,
        # Proxy settings from ~/.docker/config.json would leak into every build as
        # build args: an offline build must not depend on the host's client config.
        "use_config_proxy": False,
    }


def write_build_context(
    context_dir: Path, out: IO[bytes], *, dockerfile: str, source_date_epoch: int | None
) -> None:
    """The context tar, the same bytes whatever the checkout time, umask or owner.

    The classic builder copies mode and mtime from the context into COPY layers, so a
    file checked out under umask 002 or a day later would change the layer. Entries are
    sorted, owned by 0:0, modes reduced to 0644/0755 and mtimes clamped. ``.dockerignore``
    is honoured with the SDK's own matcher, so it means what ``docker build`` makes of it.
    """
    patterns = _dockerignore_patterns(context_dir)
    names = sorted(docker.utils.build.exclude_paths(str(context_dir), patterns, dockerfile))
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in names:
            path = context_dir / name
            info = tar.gettarinfo(str(path), arcname=name)
            if info is None:  # a socket: docker build skips those too
                continue
            _normalize_member(info, source_date_epoch)
            if info.isfile():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)


def _dockerignore_patterns(context_dir: Path) -> list[str]:
    ignore = context_dir / ".dockerignore"
    if not ignore.is_file():
        return []
    lines = (line.strip() for line in ignore.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _normalize_member(info: tarfile.TarInfo, source_date_epoch: int | None) -> None:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.isdir():
        info.mode = 0o755
    elif not info.issym():
        info.mode = 0o755 if info.mode & 0o100 else 0o644
    mtime = int(info.mtime)
    info.mtime = mtime if source_date_epoch is None else min(mtime, source_date_epoch)


# --- containers ------------------------------------------------------------------------


def container_name() -> str:
    """A fresh name that marks the container as stackpin's (cleanup finds it by prefix)."""
    return f"{CONTAINER_PREFIX}{uuid.uuid4().hex}"


def host_config_kwargs(request: RunRequest) -> dict[str, Any]:
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
    return kwargs


def gpu_device_request(gpus: str) -> dict[str, Any]:
    """``--gpus`` semantics: "all", a count, or "device=0,1"."""
    if gpus == "all":
        return {"count": -1, "capabilities": [["gpu"]]}
    if gpus.isdigit():
        return {"count": int(gpus), "capabilities": [["gpu"]]}
    ids = gpus.removeprefix("device=").split(",")
    return {"device_ids": ids, "capabilities": [["gpu"]]}


def with_run_flags(request: RunRequest, flags: RunFlags) -> RunRequest:
    """The request plus a cell's platform run flags (device nodes, groups, mounts, shm)."""
    return replace(
        request,
        devices=request.devices + flags.devices,
        group_add=request.group_add + flags.group_add,
        volumes=request.volumes + flags.volumes,
        shm_size=flags.shm_size or request.shm_size,
        gpus=flags.gpus or request.gpus,
        ipc_mode=flags.ipc or request.ipc_mode,
        cap_add=request.cap_add + flags.cap_add,
        security_opt=request.security_opt + flags.security_opt,
    )


def container_kwargs(request: RunRequest, name: str) -> dict[str, Any]:
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
    """A started container inside ``Engine.container``; removed when the block ends."""

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

    def copy_out(self, container_path: str, dest_dir: Path) -> None:
        """Copy a file or directory out of the container into ``dest_dir``."""
        stream, _stat = self._api.get_archive(self.id, container_path)
        dest_dir.mkdir(parents=True, exist_ok=True)
        reader = chunk_stream(stream)
        with reader, tarfile.open(fileobj=reader, mode="r|") as tar:
            # The data filter refuses absolute paths, links out of dest_dir and devices.
            tar.extractall(dest_dir, filter="data")


class _ChunkReader(io.RawIOBase):
    """A read-only raw stream over an iterator of byte chunks (for tarfile's "r|")."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = chunk
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def chunk_stream(chunks: Iterable[bytes], buffer_size: int = 1 << 20) -> IO[bytes]:
    """A buffered file object over an iterator of byte chunks (a save stream, say)."""
    return io.BufferedReader(_ChunkReader(chunks), buffer_size=buffer_size)


def _no_daemon_message(url: str) -> str:
    return (
        f"no Docker daemon answers at {url}: start one "
        "(e.g. `dockerd &` as root, or `systemctl start docker`)"
    )


def _needs_daemon(
    method: Callable[Concatenate[Engine, P], R],
) -> Callable[Concatenate[Engine, P], R]:
    """A daemon that stops mid-session gets the same one-line error as one never started."""

    def call(self: Engine, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except requests.exceptions.ConnectionError:
            raise HostEnvironmentError(_no_daemon_message(self.url)) from None

    call.__name__, call.__qualname__, call.__doc__ = (
        method.__name__, method.__qualname__, method.__doc__
    )
    return call


# --- the engine ------------------------------------------------------------------------


class Engine:
    """A connection to one Docker daemon; every method takes or returns plain data."""

    def __init__(
        self, *, api: docker.APIClient, client_kwargs: Mapping[str, Any], url: str
    ) -> None:
        self._api = api
        self._client_kwargs = dict(client_kwargs)
        self.url = url

    @classmethod
    def connect(cls, *, environ: Mapping[str, str] | None = None, timeout_s: int = 60) -> Engine:
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

    def __enter__(self) -> Engine:
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
    def version(self) -> EngineVersion:
        data = self._api.version()
        return EngineVersion(
            version=str(data.get("Version", "")),
            api_version=str(data.get("ApiVersion", "")),
            os=str(data.get("Os", "")),
            arch=str(data.get("Arch", "")),
        )

    # images ---------------------------------------------------------------------------

    @_needs_daemon
    def image_info(self, reference: str) -> ImageInfo | None:
        """The image a reference (name:tag, ID or name@digest) names here, or None."""
        try:
            data = self._api.inspect_image(reference)  # type: ignore[no-untyped-call]
            return image_info_from_inspect(data)
        except docker.errors.ImageNotFound:
            return None

    def image_exists(self, reference: str) -> bool:
        return self.image_info(reference) is not None

    @_needs_daemon
    def list_images(self, label: str) -> list[ImageInfo]:
        """Every local image carrying ``label`` ("key" or "key=value"), newest first."""
        summaries = self._api.images(filters={"label": label})
        infos = [self.image_info(str(s["Id"])) for s in summaries]
        found = [i for i in infos if i is not None]
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
    def pull(self, reference: str) -> ImageInfo:
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

    def _must_inspect(self, reference: str) -> ImageInfo:
        info = self.image_info(reference)
        if info is None:
            msg = f"image {reference} vanished from the daemon right after it was created"
            raise HostEnvironmentError(msg)
        return info

    # build ----------------------------------------------------------------------------

    @_needs_daemon
    def build(
        self, request: BuildRequest, *, on_line: Callable[[str], None] = _ignore
    ) -> BuildResult:
        """Build, streaming each output line to ``on_line`` and to ``request.log_path``."""
        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        with request.log_path.open("w", encoding="utf-8") as log:

            def emit(lines: list[str]) -> None:
                for line in lines:
                    log.write(line + "\n")
                    log.flush()  # a crash or Ctrl-C keeps everything seen so far
                    on_line(line)

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
        return BuildResult(
            image_id=tally.image_id,
            tags=request.tags,
            log_path=request.log_path,
            steps=tally.steps,
            cached_steps=tally.cached_steps,
        )

    def _stream_build(
        self, request: BuildRequest, emit: Callable[[list[str]], None]
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
    def container(self, request: RunRequest) -> Iterator[RunningContainer]:
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
    def _start(self, request: RunRequest, name: str) -> RunningContainer:
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

    def run_to_completion(self, request: RunRequest, *, timeout_s: int) -> RunResult:
        """Run a command to its end (or to ``timeout_s``) and collect its output."""
        with self.container(request) as running:
            code = running.wait(timeout_s)
            return RunResult(
                exit_code=-1 if code is None else code,
                timed_out=code is None,
                logs=running.logs(),
                stdout=running.logs(stderr=False),
            )

    @_needs_daemon
    def list_stackpin_containers(self) -> list[str]:
        """Names of every container (running or not) that stackpin created."""
        found = self._api.containers(all=True, filters={"name": CONTAINER_PREFIX})
        names = [str(n).lstrip("/") for c in found for n in c.get("Names") or ()]
        return sorted(n for n in names if n.startswith(CONTAINER_PREFIX))

    # save / load / import -------------------------------------------------------------

    def save(self, request: SaveRequest) -> Iterator[bytes]:
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
                yield from response.iter_content(request.chunk_size)

    @_needs_daemon
    def load(self, source: Path | IO[bytes] | Iterable[bytes]) -> LoadResult:
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
        return LoadResult(references=references, image_ids=ids)

    @_needs_daemon
    def import_image(self, request: ImportRequest) -> ImageInfo:
        """``docker import`` of a rootfs tar with Dockerfile ``changes`` (ENV, CMD...)."""
        reference = f"{request.repository}:{request.tag}"
        try:
            with self._streaming_client() as api:
                api.import_image(
                    src=str(request.tar_path),
                    repository=request.repository,
                    tag=request.tag,
                    changes=list(request.changes),
                )
        except docker.errors.APIError as exc:
            msg = f"the Docker daemon cannot import {request.tar_path}: {_api_message(exc)}"
            raise HostEnvironmentError(msg) from None
        return self._must_inspect(reference)


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
