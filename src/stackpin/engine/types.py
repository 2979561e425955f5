"""Plain engine types: what callers hand an engine and what comes back (no SDK here).

As ``docker.types`` sits apart from ``docker.api`` in docker-py, these frozen requests and
results are all that the pipeline (render, build, normalise, bundle, verification) needs to
know about an engine; the transport that speaks to a daemon is ``stackpin.engine.docker_api``.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from stackpin.matrix import RunFlags

# --- requests ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """One build of a context directory, by the classic builder or BuildKit (buildx)."""

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
    builder: str = "classic"  # or "buildkit" (stackpin.engine.buildx.select_builder)
    # BuildKit only: the engine clamps layer mtimes to source_date_epoch itself (export
    # as a docker tar with rewrite-timestamp, loaded).
    rewrite_timestamps: bool = False
    # BuildKit only: the image comes out reproducible as built (the engine's rewrite, or
    # the Dockerfile's clamped steps with the engine's clamped config): no normalisation.
    native_timestamps: bool = False


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
    ulimits: tuple[str, ...] = ()  # "memlock=-1:-1", as docker --ulimit and the cell write them
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



# --- results ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    image_id: str
    tags: tuple[str, ...]
    log_path: Path
    steps: int
    cached_steps: int
    builder: str = "classic"
    # The engine wrote reproducible timestamps: the image needs no normalisation.
    native_timestamps: bool = False


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
class HistoryItem:
    """One step of an image's history as the daemon's ``/images/<id>/history`` gives it."""

    created_by: str
    comment: str
    size: int  # bytes of the step's layer; 0 for a metadata step (and for an empty layer)


@dataclass(frozen=True, kw_only=True)
class ImageRecord:
    """What the daemon records of an image's config without a ``docker save``: the runtime
    settings of ``/images/<id>/json`` (every field, zero or not), platform, author, layers
    and history oldest first (stackpin.normalize_record rebuilds a config from it)."""

    settings: Mapping[str, Any]
    architecture: str
    os: str
    variant: str
    author: str
    diff_ids: tuple[str, ...]
    history: tuple[HistoryItem, ...]


@dataclass(frozen=True, kw_only=True)
class EngineVersion:
    version: str
    api_version: str
    os: str
    arch: str
    # "classic" (graph drivers; an image is named by its config digest) or "containerd"
    # (the containerd image store; an image is named by its manifest digest).
    store: str = "classic"

    def image_id(self, *, config_digest: str, manifest_digest: str) -> str:
        """The ID this engine gives an image: identity is defined per store."""
        return manifest_digest if self.store == "containerd" else config_digest

    @property
    def saves_oci_layout(self) -> bool:
        """Whether ``docker save`` sends an OCI image layout, each blob named by its digest
        (Engine 25, API 1.44, and later), rather than Engine 20.10's docker-archive."""
        api = tuple(int(p) for p in self.api_version.split(".")[:2] if p.isdigit())
        return api >= (1, 44)


@dataclass(frozen=True, kw_only=True)
class EngineReport:
    """What `stackpin doctor` reports about the engine (from /version and /info)."""

    version: EngineVersion
    cgroup_version: str
    cgroup_driver: str
    runtimes: tuple[str, ...]
    default_runtime: str
    security_options: tuple[str, ...]  # "name=seccomp,profile=builtin", "name=userns", ...
    buildkit: bool  # the daemon serves BuildKit builds (API 1.39+: the embedded BuildKit)
    root_dir: str = ""  # DockerRootDir: where images, layers and build caches fill the disk
    host_name: str = ""  # the daemon's host name (Docker Desktop's VM says "docker-desktop")


def engine_report(version: EngineVersion, info: Mapping[str, Any]) -> EngineReport:
    api = tuple(int(p) for p in version.api_version.split(".")[:2] if p.isdigit())
    return EngineReport(
        version=version,
        cgroup_version=str(info.get("CgroupVersion") or "1"),
        cgroup_driver=str(info.get("CgroupDriver") or ""),
        runtimes=tuple(sorted(info.get("Runtimes") or {})),
        default_runtime=str(info.get("DefaultRuntime") or ""),
        security_options=tuple(str(o) for o in info.get("SecurityOptions") or ()),
        buildkit=api >= (1, 39),
        root_dir=str(info.get("DockerRootDir") or ""),
        host_name=str(info.get("Name") or ""),
    )


def store_of(info: Mapping[str, Any]) -> str:
    """The image store named by the daemon's ``/info`` document."""
    status = {str(k): str(v) for k, v in info.get("DriverStatus") or ()}
    return "containerd" if "containerd" in status.get("driver-type", "") else "classic"


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


def image_record_from(inspect: Mapping[str, Any],
                      history: Iterable[Mapping[str, Any]]) -> ImageRecord:
    """ImageRecord from ``/images/<id>/json`` and ``/images/<id>/history`` (newest first)."""
    return ImageRecord(
        settings=dict(inspect.get("Config") or {}),
        architecture=str(inspect.get("Architecture") or ""),
        os=str(inspect.get("Os") or ""),
        variant=str(inspect.get("Variant") or ""),
        author=str(inspect.get("Author") or ""),
        diff_ids=tuple((inspect.get("RootFS") or {}).get("Layers") or ()),
        history=tuple(HistoryItem(created_by=str(h.get("CreatedBy") or ""),
                                  comment=str(h.get("Comment") or ""),
                                  size=int(h.get("Size") or 0))
                      for h in reversed(list(history))),
    )


def unpacked_size(summary: Mapping[str, Any]) -> int:
    """The unpacked bytes of an ``/images/json?manifests=1`` entry's images, 0 when the
    daemon does not say (the classic store, whose ``Size`` is already unpacked, or API
    before 1.47). Attestation manifests and platforms not present locally count nothing."""
    return sum(
        int(((manifest.get("ImageData") or {}).get("Size") or {}).get("Unpacked") or 0)
        for manifest in summary.get("Manifests") or ()
        if manifest.get("Kind") == "image" and manifest.get("Available")
    )


def digest_matches(info: ImageInfo, pinned: str) -> bool:
    """Whether a pinned ``sha256:`` is this image's ID or one of its registry digests.

    A base loaded from a ``docker save`` tar has no RepoDigests (load drops them), so the
    image ID (the config digest) is what an air-gapped site pins.
    """
    registry = {d.rpartition("@")[2] for d in info.repo_digests}
    return pinned == info.id or pinned in registry


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
        ulimits=request.ulimits + flags.ulimits,
    )



# --- byte streams ------------------------------------------------------------------------


class _ChunkReader(io.RawIOBase):
    """A read-only raw stream over an iterator of byte chunks (for tarfile's "r|")."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        # Views, not slices of bytes: each byte is copied once, into the caller's buffer.
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def chunk_stream(chunks: Iterable[bytes], buffer_size: int = 1 << 20) -> IO[bytes]:
    """A buffered file object over an iterator of byte chunks (a save stream, say)."""
    return io.BufferedReader(_ChunkReader(chunks), buffer_size=buffer_size)
