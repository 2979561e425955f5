"""The one fake engine of the unit tests: a daemon in memory that speaks `docker save`.

It implements ``stackpin.engine.Engine`` as one of three engines (``kind``):

- "docker20": Engine 20.10. The image ID is the config digest; ``save`` writes the
  docker-archive layout (a layer shared by several images stored once, a layer repeated
  inside one image linked); ``load`` reads its ``manifest.json``.
- "classic": Engine 25+ with the classic store. The ID is the config digest; ``save`` writes
  the OCI layout with uncompressed layers and a ``manifest.json`` into ``blobs/``.
- "containerd": Engine 25+ with the containerd image store. The ID is the manifest digest;
  layers are kept and saved gzip-compressed; ``load`` keeps the manifest of an OCI layout and
  makes one (uncompressed, Docker media types) for a docker-archive.

``put`` registers an image by a given ``ImageInfo`` where only its metadata matters (a pinned
base, say); its saved config is synthesised from that info. Every call is recorded.

A container run prints ``run_stdout`` and exits 0, unless ``on_run`` says what it does
(the verification suite writing its reports into its bind mount, say).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from stackpin.bundle.delta import chain_ids
from stackpin.engine import (
    BuildRequest,
    BuildResult,
    Engine,
    EngineVersion,
    ImageInfo,
    LoadResult,
    RunRequest,
    RunResult,
    SaveRequest,
)
from stackpin.engine.types import EngineReport, ImageRecord, engine_report, image_record_from
from stackpin.errors import BuildError, HostEnvironmentError

# The runtime fields the daemon's inspect lists for every image, set or not.
ZERO_SETTINGS: dict[str, Any] = {
    "Hostname": "", "Domainname": "", "User": "", "AttachStdin": False, "AttachStdout": False,
    "AttachStderr": False, "Tty": False, "OpenStdin": False, "StdinOnce": False, "Env": None,
    "Cmd": None, "Image": "", "Volumes": None, "WorkingDir": "", "Entrypoint": None,
    "OnBuild": None, "Labels": None,
}
# What a build makes: (config, layers) for a request and the count of builds so far.
Recipe = Callable[[BuildRequest, int], tuple[dict[str, Any], list[bytes]]]
# What a container run does: its result (and whatever it writes into its mounts).
RunHook = Callable[[RunRequest], RunResult]


@dataclass
class FakeRunning:
    """A container of the fake: it has already run (``result``) when the block starts."""

    id: str
    result: RunResult

    def wait(self, timeout_s: int) -> int | None:
        return None if self.result.timed_out else self.result.exit_code

    def logs(self, *, stderr: bool = True) -> str:
        return self.result.logs


def digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def archive_members(data: bytes) -> dict[str, bytes]:
    """Every regular file of a tar, by name (to look inside what was saved or loaded)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


@dataclass
class StoredImage:
    config: bytes
    layers: list[bytes]  # uncompressed tars
    info: ImageInfo | None = None  # set by ``put``: metadata given, not derived from config
    manifest: bytes = b""  # the containerd store's manifest (its digest is the image ID)
    blobs: dict[str, bytes] = field(default_factory=dict)  # layer blobs it names, by digest


def gzip_layer(layer: bytes) -> bytes:
    return gzip.compress(layer, mtime=0)


def oci_manifest(config: bytes, blobs: list[bytes], *, media_type: str = OCI_MANIFEST) -> bytes:
    layer_type = ("application/vnd.oci.image.layer.v1.tar+gzip" if media_type == OCI_MANIFEST
                  else "application/vnd.docker.image.rootfs.diff.tar")
    return json.dumps({
        "schemaVersion": 2, "mediaType": media_type,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": layer_type, "digest": digest(b), "size": len(b)} for b in blobs],
    }).encode()


@dataclass
class FakeEngine:
    kind: str = "docker20"  # "docker20", "classic" or "containerd": see the module docstring
    images: dict[str, StoredImage] = field(default_factory=dict)  # by image ID
    tags: dict[str, str] = field(default_factory=dict)  # reference -> image ID
    run_stdout: str = ""  # what every container run prints
    on_run: RunHook | None = None  # what a container run does (default: prints run_stdout)
    recipe: Recipe | None = None  # what builds make; None: a build fails
    fail_builds: bool = False
    interrupt_after: int | None = None  # save raises KeyboardInterrupt after this many chunks
    reverse_manifest: bool = False  # save lists images in the other order
    saved: list[SaveRequest] = field(default_factory=list)
    loaded: list[bytes] = field(default_factory=list)
    layers_not_sent: list[str] = field(default_factory=list)  # chains a load took as held
    runs: list[RunRequest] = field(default_factory=list)
    builds: list[BuildRequest] = field(default_factory=list)
    pulled: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    # --- setting up -----------------------------------------------------------------

    def add(self, config: dict[str, Any], layers: list[bytes], tags: Iterable[str] = ()) -> str:
        """Store an image made of ``layers``; its ID is the digest of the resulting config."""
        config = {**config, "rootfs": {"type": "layers", "diff_ids": [digest(x) for x in layers]}}
        return self._store(json.dumps(config, indent=1).encode(), list(layers), tags)

    def _store(self, config: bytes, layers: list[bytes], tags: Iterable[str],
               manifest: bytes = b"", blobs: list[bytes] | None = None) -> str:
        """Keep an image as this kind of engine does; returns its ID."""
        stored = StoredImage(config=config, layers=layers)
        if self.kind == "containerd":
            blobs = [gzip_layer(x) for x in layers] if blobs is None else blobs
            stored.manifest = manifest or oci_manifest(config, blobs)
            stored.blobs = {digest(b): b for b in blobs}
        image_id = digest(stored.manifest or config)
        self.images[image_id] = stored
        for reference in tags:
            self.tags[reference] = image_id
        return image_id

    def put(self, info: ImageInfo, layers: list[bytes] | None = None) -> str:
        """Store an image known by its metadata alone (its ID is taken as given)."""
        layers = [info.id.encode()] if layers is None else layers
        config = {"architecture": info.architecture, "os": info.os, "created": info.created,
                  "config": {"Labels": dict(info.labels), "Env": list(info.env),
                             "Entrypoint": list(info.entrypoint), "Cmd": list(info.cmd)},
                  "rootfs": {"type": "layers", "diff_ids": [digest(x) for x in layers]}}
        self.images[info.id] = StoredImage(config=json.dumps(config).encode(), layers=layers,
                                           info=replace(info, tags=()))
        for reference in info.tags:
            self.tags[reference] = info.id
        return info.id

    # --- the Engine protocol --------------------------------------------------------

    def version(self) -> EngineVersion:
        version = "20.10.24" if self.kind == "docker20" else "28.5.2"
        store = "containerd" if self.kind == "containerd" else "classic"
        api = "1.41" if self.kind == "docker20" else "1.51"
        return EngineVersion(version=version, api_version=api, os="linux", arch="amd64",
                             store=store)

    def report(self) -> EngineReport:
        info = {"CgroupVersion": "2", "CgroupDriver": "systemd", "Runtimes": {"runc": {}},
                "DefaultRuntime": "runc", "Name": "fake-engine"}
        return engine_report(self.version(), info)

    def _resolve(self, reference: str) -> str | None:
        image_id = self.tags.get(reference, reference)
        return image_id if image_id in self.images else None

    def image_info(self, reference: str) -> ImageInfo | None:
        image_id = self._resolve(reference)
        if image_id is None:
            return None
        stored = self.images[image_id]
        tags = tuple(sorted(t for t, i in self.tags.items() if i == image_id))
        if stored.info is not None:
            return replace(stored.info, tags=tags)
        config = json.loads(stored.config)
        settings = config.get("config") or {}
        return ImageInfo(
            id=image_id, tags=tags, repo_digests=(), labels=settings.get("Labels") or {},
            size=self._size(stored), created=str(config.get("created", "")),
            env=tuple(settings.get("Env") or ()), entrypoint=tuple(settings.get("Entrypoint") or ()),
            cmd=tuple(settings.get("Cmd") or ()), diff_ids=tuple(config["rootfs"]["diff_ids"]),
            architecture=str(config.get("architecture", "amd64")), os=str(config.get("os", "linux")),
        )

    def _size(self, stored: StoredImage) -> int:
        """Inspect's Size: the unpacked layers on a classic store; on the containerd store
        the content it holds (its blobs, gzip as built, config and manifest), what Docker
        28.5 reports there (a CPU image: 746058666 bytes for a 746072064-byte save)."""
        if self.kind == "containerd":
            return sum(map(len, stored.blobs.values())) + len(stored.config) + len(stored.manifest)
        return sum(len(x) for x in stored.layers)

    def image_record(self, reference: str) -> ImageRecord | None:
        """As the daemon's inspect and history: every runtime field (zero ones too) and
        each step's layer size, 0 for a step without one, newest first."""
        image_id = self._resolve(reference)
        if image_id is None:
            return None
        stored = self.images[image_id]
        config = json.loads(stored.config)
        inspect = {"Id": image_id, "Config": {**ZERO_SETTINGS, **(config.get("config") or {})},
                   "Architecture": config.get("architecture", "amd64"),
                   "Os": config.get("os", "linux"), "Author": config.get("author", ""),
                   "RootFS": {"Type": "layers", "Layers": config["rootfs"]["diff_ids"]}}
        sizes = iter(len(x) for x in stored.layers)
        history = [{"Id": "<missing>", "Created": 0, "CreatedBy": h.get("created_by", ""),
                    "Comment": h.get("comment", ""),
                    "Size": 0 if h.get("empty_layer") else next(sizes, 0)}
                   for h in config.get("history") or ()]
        return image_record_from(inspect, list(reversed(history)))

    def list_images(self, label: str) -> list[ImageInfo]:
        key, _, value = label.partition("=")
        infos = [i for i in map(self.image_info, list(self.images)) if i is not None]
        found = [i for i in infos if key in i.labels and (not value or i.labels[key] == value)]
        return sorted(found, key=lambda i: (i.created, i.id), reverse=True)

    def tag(self, image: str, reference: str) -> None:
        image_id = self._resolve(image)
        assert image_id is not None, f"tag of an unknown image {image}"
        self.tags[reference] = image_id

    def remove_image(self, reference: str, *, force: bool = False) -> bool:
        """As the daemon: a tag goes first; the image goes with its last tag."""
        self.removed.append(reference)
        if reference in self.tags:
            image_id = self.tags.pop(reference)
            if image_id not in self.tags.values():
                del self.images[image_id]
            return True
        if reference not in self.images:
            return False
        for tag in [t for t, i in self.tags.items() if i == reference]:
            del self.tags[tag]
        del self.images[reference]
        return True

    def pull(self, reference: str) -> ImageInfo:
        self.pulled.append(reference)
        self.add({"pulled": reference}, [reference.encode()], tags=(reference,))
        info = self.image_info(reference)
        assert info is not None
        return info

    def build(self, request: BuildRequest, *, on_line: Callable[[str], None] = print
              ) -> BuildResult:
        self.builds.append(request)
        if self.fail_builds or self.recipe is None:
            msg = f"build failed at Step 3/9: boom; full log: {request.log_path}"
            raise BuildError(msg)
        config, layers = self.recipe(request, len(self.builds))
        image_id = self.add(config, layers, tags=request.tags)
        # A BuildKit build reproducible as built says so, as DockerEngine does.
        return BuildResult(image_id=image_id, tags=request.tags, log_path=request.log_path,
                           steps=len(layers), cached_steps=0, builder=request.builder,
                           native_timestamps=request.native_timestamps)

    def run_to_completion(self, request: RunRequest, *, timeout_s: int) -> RunResult:
        with self.container(request) as running:
            return running.result

    @contextlib.contextmanager
    def container(self, request: RunRequest) -> Iterator[FakeRunning]:
        self.runs.append(request)
        if self._resolve(request.image) is None:
            msg = f"the Docker daemon refused to run {request.image}: no such image"
            raise HostEnvironmentError(msg)
        result = self.on_run(request) if self.on_run is not None else RunResult(
            exit_code=0, timed_out=False, logs=self.run_stdout, stdout=self.run_stdout)
        yield FakeRunning(id=f"fake{len(self.runs):04d}", result=result)

    def save(self, request: SaveRequest) -> Iterator[bytes]:
        self.saved.append(request)
        ids = [self._resolve(name) for name in request.images]
        if None in ids:
            msg = f"the Docker daemon cannot save {', '.join(request.images)}: no such image"
            raise HostEnvironmentError(msg)
        by_id = {i: sorted(n for n in request.images if self.tags.get(n) == i) for i in ids if i}
        images = [(self.images[i], tags) for i, tags in by_id.items()]
        if self.kind == "docker20":
            data = save_archive(images, reverse_manifest=self.reverse_manifest)
        else:
            data = save_oci_layout(images, reverse_manifest=self.reverse_manifest)
        for count, start in enumerate(range(0, len(data), 1 << 16)):
            if self.interrupt_after is not None and count >= self.interrupt_after:
                raise KeyboardInterrupt
            yield data[start:start + (1 << 16)]

    def load(self, source: Path | IO[bytes] | Iterable[bytes]) -> LoadResult:
        """Read a docker-archive as the daemon does: configs and layers must match."""
        if isinstance(source, Path):
            data = source.read_bytes()
        elif isinstance(source, io.IOBase):
            data = source.read()
        else:
            data = b"".join(source)
        self.loaded.append(data)
        try:
            files = archive_members(data)
            entries = json.loads(files["manifest.json"])
        except (tarfile.TarError, KeyError, ValueError) as exc:
            msg = f"the Docker daemon could not load the archive: {exc}"
            raise HostEnvironmentError(msg) from None
        references: list[str] = []
        image_ids: list[str] = []
        for entry in entries:
            config = files[entry["Config"]]
            layers = self._layers_of(files, entry["Layers"], json.loads(config))
            manifest, blobs = b"", None
            if self.kind == "containerd":
                manifest = _manifest_of(files, digest(config))
                if manifest:  # an OCI layout: its manifest and blobs are kept as they are
                    blobs = layers
                    layers = [gzip.decompress(x) if x[:2] == b"\x1f\x8b" else x for x in layers]
                else:  # a docker-archive: the store writes a manifest for it
                    blobs = layers
                    manifest = oci_manifest(config, layers, media_type=DOCKER_MANIFEST)
            diff_ids = json.loads(config)["rootfs"]["diff_ids"]
            assert diff_ids == [digest(x) for x in layers], "layers do not match the config"
            tags = entry.get("RepoTags") or ()
            image_id = self._store(config, layers, tags, manifest, blobs)
            references.extend(tags or (image_id,))
            image_ids.append(image_id)
        return LoadResult(references=tuple(references), image_ids=tuple(image_ids))

    def _layers_of(self, files: dict[str, bytes], names: list[str],
                   config: dict[str, Any]) -> list[bytes]:
        """The layer files; as the classic store's load, one the archive lacks is taken
        from the store when its chain is held there (never read), else the load fails."""
        held: dict[str, bytes] = {}
        if self.kind != "containerd":
            for stored in self.images.values():
                for chain, layer in zip(chain_ids([digest(x) for x in stored.layers]),
                                        stored.layers, strict=True):
                    held[chain] = layer
        chains = chain_ids(config["rootfs"]["diff_ids"])
        layers = []
        for name, chain in zip(names, chains, strict=True):
            if name in files:
                layers.append(files[name])
            elif chain in held:
                self.layers_not_sent.append(chain)
                layers.append(held[chain])
            else:
                msg = f"the Docker daemon could not load the archive: no file {name}"
                raise HostEnvironmentError(msg)
        return layers


def _manifest_of(files: dict[str, bytes], config_digest: str) -> bytes:
    """The manifest an OCI layout's index.json gives for a config, or b""."""
    if "index.json" not in files:
        return b""
    for descriptor in json.loads(files["index.json"])["manifests"]:
        manifest = files[f"blobs/sha256/{descriptor['digest'][7:]}"]
        if json.loads(manifest)["config"]["digest"] == config_digest:
            return manifest
    return b""


def save_oci_layout(images: list[tuple[StoredImage, list[str]]], *,
                    reverse_manifest: bool = False) -> bytes:
    """What Engine 25+ saves: blobs, index.json, manifest.json into blobs/, oci-layout."""
    out = io.BytesIO()
    manifest, index = [], []
    written: set[str] = set()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for stored, tags in images:
            blobs = list(stored.blobs.values()) if stored.manifest else stored.layers
            document = stored.manifest or oci_manifest(stored.config, blobs)
            if stored.manifest:
                names = [d["digest"] for d in json.loads(document)["layers"]]
            else:
                names = [digest(x) for x in stored.layers]
            by_digest = {digest(b): b for b in blobs}
            for data in [*(by_digest[n] for n in names), stored.config, document]:
                if digest(data) not in written:
                    written.add(digest(data))
                    _file(tar, f"blobs/sha256/{digest(data)[7:]}", data, mtime=0)
            index.append({"mediaType": OCI_MANIFEST, "digest": digest(document),
                          "size": len(document)})
            manifest.append({"Config": f"blobs/sha256/{digest(stored.config)[7:]}",
                             "RepoTags": tags or None,
                             "Layers": [f"blobs/sha256/{n[7:]}" for n in names]})
        if reverse_manifest:
            manifest.reverse()
        _file(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": index}).encode(),
              mtime=0)
        _file(tar, "manifest.json", json.dumps(manifest).encode() + b"\n", mtime=0)
        _file(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', mtime=0)
    return out.getvalue()


def save_archive(images: list[tuple[StoredImage, list[str]]], *,
                 reverse_manifest: bool = False) -> bytes:
    """The docker-archive bytes of ``(image, tags)`` pairs, in that order."""
    out = io.BytesIO()
    manifest = []
    seen: dict[bytes, str] = {}
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for stored, tags in images:
            names: list[str] = []
            for layer in stored.layers:
                if layer in seen and seen[layer] not in names:  # shared with another image
                    names.append(seen[layer])
                    continue
                if layer in seen:  # listed twice in one image: docker save links it
                    link = f"{len(seen) + len(names):063x}f/layer.tar"
                    _symlink(tar, link, f"../{seen[layer]}")
                    names.append(link)
                    continue
                name = f"{len(seen):064x}/layer.tar"
                seen[layer] = name
                names.append(name)
                for extra, data in (("VERSION", b"1.0"), ("json", b"{}"), ("layer.tar", layer)):
                    _file(tar, f"{name.split('/')[0]}/{extra}", data)
            config_name = f"{hashlib.sha256(stored.config).hexdigest()}.json"
            _file(tar, config_name, stored.config)
            manifest.append({"Config": config_name, "RepoTags": tags or None, "Layers": names})
        if reverse_manifest:
            manifest.reverse()
        _file(tar, "manifest.json", json.dumps(manifest).encode() + b"\n", mtime=0)
        _file(tar, "repositories", b"{}\n", mtime=0)
    return out.getvalue()


def _file(tar: tarfile.TarFile, name: str, data: bytes, mtime: int = 1735689600) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), mtime
    tar.addfile(info, io.BytesIO(data))


def _symlink(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    tar.addfile(info)


def _conforms(engine: FakeEngine) -> Engine:
    return engine  # mypy (its files list this module) checks the fake keeps to the protocol
