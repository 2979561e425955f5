"""``docker save`` archives in both layouts: one streaming reader, one writer (no SDK).

- docker-archive (Engine before 25): ``<hex>.json`` configs, ``<dir>/layer.tar`` layers (a
  layer listed twice in one image is stored once plus a symlink) and ``manifest.json``.
- OCI image layout (Engine 25 and later, both stores): ``oci-layout``, ``index.json`` and
  ``blobs/sha256/<hex>`` for manifests, configs and layers (gzip-compressed on the containerd
  image store), plus a ``manifest.json`` whose paths point into ``blobs/``.

The reader detects the layout. In both, ``manifest.json`` comes after the layers, so what
a member is can only be known at the end: each file is sniffed instead (JSON documents
start with ``{`` or ``[``, gzip with 1f 8b, zstd with 28 b5 2f fd), layers are handed to the
caller uncompressed while their diff_id is hashed, and documents are kept in memory.

Image identity depends on the store, not on the layout: the classic store names an image by
its config digest, the containerd store by its manifest digest. The writer emits the OCI
layout with a ``manifest.json`` beside it (as Engine 25+ does): Engine 20.10 reads the
latter, every later engine the former, and both digests are known before the load.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import json
import posixpath
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Generic, Literal, TypeVar, cast

import zstandard

from stackpin import primitives
from stackpin.engine.types import chunk_stream
from stackpin.errors import HostEnvironmentError
from stackpin.primitives import (
    CHUNK,
    HashingReader,
    hash_stream,
    tar_end,
    tar_header,
    tar_member,
    tar_padding,
)
from stackpin.tarstream import read_tar_stream

T = TypeVar("T")
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_DOCUMENT = 64 << 20  # a config or manifest larger than this is not one
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
Layout = Literal["docker-archive", "oci"]


def sha256_digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


# --- reading --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SavedLayer(Generic[T]):
    diff_id: str  # digest of the uncompressed tar
    compression: str  # "", "gzip" or "zstd": how the archive carried it
    value: T  # what the caller's on_layer made of it
    # The name to keep the layer by, where read_save was given ``known``: an OCI blob's
    # digest as its member name gives it, once its bytes hashed to it ("" where they did
    # not); a docker-archive layer.tar's ``tar_head_name``. "" without ``known`` (nobody
    # asked: a compressed blob is not hashed twice).
    blob: str = ""


@dataclass(frozen=True, kw_only=True)
class KnownLayer(Generic[T]):
    """A layer the caller holds already, by blob digest: ``read_save`` only hashes its bytes
    against the blob's name and hands back ``value`` instead of calling ``on_layer``."""

    diff_id: str
    value: T
    size: int | None = None  # of the uncompressed tar, where the caller knows it


@dataclass(frozen=True, kw_only=True)
class SavedEntry:
    """One image of the archive (an entry of its ``manifest.json``)."""

    config: Mapping[str, Any]
    config_bytes: bytes  # as the engine stored it (its digest is config_digest)
    config_digest: str
    manifest_digest: str  # its OCI manifest; "" in a docker-archive
    repo_tags: tuple[str, ...]
    layer_members: tuple[str, ...]  # member names in config order, links resolved

    def is_image(self, image_id: str) -> bool:
        """Whether an engine's image ID names this entry, on either store."""
        return image_id in (self.config_digest, self.manifest_digest)


@dataclass(frozen=True, kw_only=True)
class SaveContents(Generic[T]):
    layout: Layout
    entries: tuple[SavedEntry, ...]
    layers: Mapping[str, SavedLayer[T]]  # by member name

    def entry_for(self, image_id: str) -> SavedEntry:
        for entry in self.entries:
            if entry.is_image(image_id):
                return entry
        msg = f"the save archive holds no image {image_id}; check it with `docker images`"
        raise HostEnvironmentError(msg)

    def layers_of(self, entry: SavedEntry) -> tuple[SavedLayer[T], ...]:
        return tuple(self.layers[name] for name in entry.layer_members)


def _compression(head: bytes) -> str:
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return ""


def _uncompressed(data: IO[bytes], head: bytes) -> tuple[IO[bytes], str]:
    compression = _compression(head)
    if compression == "gzip":
        return gzip.GzipFile(fileobj=data, mode="rb"), "gzip"  # type: ignore[return-value]
    if compression == "zstd":
        return zstandard.ZstdDecompressor().stream_reader(data), "zstd"
    return data, ""


def _is_layer(member: tarfile.TarInfo, head: bytes) -> bool:
    """docker-archive layers are named so; an OCI blob is a layer unless it is JSON."""
    if member.name.endswith("/layer.tar"):
        return True
    is_document = head[:1] in (b"{", b"[") and member.size <= MAX_DOCUMENT
    return member.name.startswith("blobs/") and not is_document


def _blob_digest(name: str) -> str:
    """``sha256:<hex>`` for an OCI blob member, else "" (a docker-archive layer.tar)."""
    folder, _, hexdigest = name.rpartition("/")
    if folder != "blobs/sha256" or len(hexdigest) != 64:
        return ""
    return f"sha256:{hexdigest}"


TAR_HEAD = 1 << 20  # the bytes of a docker-archive layer.tar that name it, with its size


class LayerGuessMissed(HostEnvironmentError):
    """A docker-archive layer began as a held one (size, first MiB) and then differed: its
    bytes are gone by now, so the caller reads the save again without ``known``."""


def tar_head_name(size: int, head: bytes) -> str:
    """A name for a docker-archive ``layer.tar`` (which has none of its own) from its size
    and first MiB: only a guess at which layer it is, until all its bytes hash to one."""
    digest = hashlib.sha256(b"stackpin layer.tar head %d\0" % size)
    digest.update(head)
    return f"sha256:{digest.hexdigest()}"


def _archive_layer(data: IO[bytes], member: tarfile.TarInfo,
                   on_layer: Callable[[IO[bytes]], T],
                   known: Callable[[str], KnownLayer[T] | None]) -> SavedLayer[T]:
    """A docker-archive layer: one ``known`` holds by its head name is only hashed, all of
    it (else ``LayerGuessMissed``); any other goes to ``on_layer``, named by its head."""
    head = data.read(min(TAR_HEAD, member.size))
    name = tar_head_name(member.size, head)
    whole = chunk_stream(itertools.chain([head], iter(lambda: data.read(CHUNK), b"")), CHUNK)
    held = known(name)
    if held is not None and held.size == member.size:
        if f"sha256:{hash_stream(whole)[1]}" != held.diff_id:
            msg = f"{member.name} began as the held layer {held.diff_id} and then differed"
            raise LayerGuessMissed(msg)
        return SavedLayer(diff_id=held.diff_id, compression="", value=held.value, blob=name)
    return replace(_read_layer(whole, b"", on_layer, blob=""), blob=name)


def _layer(data: IO[bytes], head: bytes, member: tarfile.TarInfo,
           on_layer: Callable[[IO[bytes]], T],
           known: Callable[[str], KnownLayer[T] | None] | None) -> SavedLayer[T]:
    """One layer: a blob ``known`` holds is only hashed; any other goes to ``on_layer``."""
    if known is not None and member.name.endswith("/layer.tar"):
        return _archive_layer(data, member, on_layer, known)
    blob = _blob_digest(member.name) if known is not None else ""
    held = known(blob) if known is not None and blob else None
    # An uncompressed blob is its own diff_id and tar: a holding that says otherwise (another
    # diff_id, another size) is not believed.
    if held is not None and (_compression(head) or (
            held.diff_id == blob and held.size in (None, member.size))):
        return _known_layer(data, head, blob, held)
    return _read_layer(data, head, on_layer, blob=blob)


def _read_layer(data: IO[bytes], head: bytes, on_layer: Callable[[IO[bytes]], T], *,
                blob: str) -> SavedLayer[T]:
    # A compressed blob is named by the digest of its compressed bytes: hashed as they
    # pass, so that its frame can be found by that name next time.
    named = HashingReader(data) if blob and _compression(head) else None
    raw, compression = _uncompressed(data if named is None else cast(IO[bytes], named), head)
    hashing = HashingReader(raw)
    reader = io.BufferedReader(hashing, buffer_size=CHUNK)
    value = on_layer(reader)
    while reader.read(CHUNK):  # what on_layer left (the tar's end padding) counts too
        pass
    diff_id = f"sha256:{hashing.sha256.hexdigest()}"
    if named is not None:
        while named.read(CHUNK):  # the compressed stream's own trailer
            pass
    digest = f"sha256:{named.sha256.hexdigest()}" if named is not None else diff_id
    return SavedLayer(diff_id=diff_id, compression=compression, value=value,
                      blob=blob if digest == blob else "")


def _known_layer(data: IO[bytes], head: bytes, blob: str, known: KnownLayer[T]) -> SavedLayer[T]:
    """A layer the caller holds: its bytes are hashed, not unpacked; they must be the blob
    its name says (else the stream is damaged, and nothing of the caller's may stand in)."""
    if f"sha256:{hash_stream(data)[1]}" != blob:
        msg = (f"the Docker daemon sent blob {blob} with other bytes: the save stream is "
               "damaged; run the command again, and `docker image inspect` the image")
        raise HostEnvironmentError(msg)
    return SavedLayer(diff_id=known.diff_id, compression=_compression(head), value=known.value,
                      blob=blob)


def read_save(stream: IO[bytes], on_layer: Callable[[IO[bytes]], T], *,
              known: Callable[[str], KnownLayer[T] | None] | None = None,
              on_read: Callable[[SavedLayer[T]], None] | None = None,
              ) -> SaveContents[T]:
    """Read a ``docker save`` stream of either layout; ``on_layer`` reads each layer tar.

    ``known`` names the layers the caller holds already (by ``sha256:<hex>``: an OCI blob's
    digest, a docker-archive layer's ``tar_head_name``): those are only hashed against
    their names (diff_ids), and ``on_layer`` is not called for them. ``on_read``
    is handed each layer as soon as it has been read and hashed, before the next comes."""
    documents: dict[str, bytes] = {}
    layers: dict[str, SavedLayer[T]] = {}
    links: dict[str, str] = {}
    try:
        with read_tar_stream(stream) as tar:
            for member in tar:
                if member.issym():
                    parent = posixpath.dirname(member.name)
                    links[member.name] = posixpath.normpath(posixpath.join(parent, member.linkname))
                elif member.islnk():
                    links[member.name] = member.linkname
                elif member.isfile():
                    data = tar.extractfile(member)
                    assert data is not None
                    head = data.peek(4)[:4]
                    if _is_layer(member, head):
                        layer = _layer(data, head, member, on_layer, known)
                        layers[member.name] = layer
                        if on_read is not None:
                            on_read(layer)
                    elif member.size <= MAX_DOCUMENT:
                        documents[member.name] = data.read()
    except (tarfile.TarError, OSError, EOFError, zstandard.ZstdError) as exc:
        msg = f"the Docker daemon sent a save stream that cannot be read ({exc})"
        raise HostEnvironmentError(msg) from None
    return _contents(documents, layers, links)


def _contents(
    documents: Mapping[str, bytes], layers: Mapping[str, SavedLayer[T]], links: Mapping[str, str]
) -> SaveContents[T]:
    if "manifest.json" not in documents:
        msg = "the save stream has no manifest.json: it is not a `docker save` archive"
        raise HostEnvironmentError(msg)
    layout: Layout = "oci" if "index.json" in documents else "docker-archive"
    manifests = _manifest_digests(documents) if layout == "oci" else {}
    entries = []
    for item in json.loads(documents["manifest.json"]):
        config_bytes = documents[item["Config"]]
        config_digest = sha256_digest(config_bytes)
        members = tuple(links.get(name, name) for name in item["Layers"])
        missing = [name for name in members if name not in layers]
        if missing:
            msg = f"the save stream lacks the layer {missing[0]} that manifest.json lists"
            raise HostEnvironmentError(msg)
        entries.append(SavedEntry(
            config=json.loads(config_bytes), config_bytes=config_bytes,
            config_digest=config_digest,
            manifest_digest=manifests.get(config_digest, ""),
            repo_tags=tuple(item.get("RepoTags") or ()), layer_members=members,
        ))
    return SaveContents(layout=layout, entries=tuple(entries), layers=dict(layers))


def _manifest_digests(documents: Mapping[str, bytes]) -> dict[str, str]:
    """Config digest -> manifest digest, from index.json (one level of nested index too)."""
    found: dict[str, str] = {}
    pending = list(json.loads(documents["index.json"]).get("manifests") or ())
    while pending:
        descriptor = pending.pop()
        blob = documents.get(f"blobs/sha256/{descriptor['digest'].removeprefix('sha256:')}")
        if blob is None:
            continue
        document = json.loads(blob)
        if descriptor.get("mediaType") == OCI_INDEX or "manifests" in document:
            pending.extend(document.get("manifests") or ())
        elif "config" in document:
            found[document["config"]["digest"]] = descriptor["digest"]
    return found


# --- writing --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One layer blob to write: its diff_id, the size of its uncompressed tar, and ``path``:
    the tar itself for ``ImageLayout.chunks``; a caller that reads ``pieces`` may keep the
    body there in a form of its own (bundle.stream: a zstd frame of body and padding)."""

    diff_id: str
    size: int
    path: Path


Piece = bytes | Layer  # layout bytes as they are, or a layer's member body + its padding


@dataclass(frozen=True, kw_only=True)
class LayoutImage:
    """One image to write: its config bytes, its layers in config order, its tags."""

    config: bytes
    layers: Sequence[Layer]  # repeats allowed
    tags: Sequence[str] = ()

    @property
    def manifest(self) -> bytes:
        return canonical_bytes({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(self.config),
                       "size": len(self.config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": layer.diff_id, "size": layer.size}
                       for layer in self.layers],
        })


@dataclass(frozen=True, kw_only=True)
class ImageLayout:
    """An archive to load, and the two IDs each of its images will have."""

    ids: tuple[tuple[str, str], ...]  # (config digest, manifest digest) per image, in order
    pieces: Iterator[Piece]  # the archive in order; a Layer stands for its body + padding

    @property
    def chunks(self) -> Iterator[bytes]:
        """The archive's bytes, each layer body read from its uncompressed tar."""
        for piece in self.pieces:
            if isinstance(piece, Layer):
                with piece.path.open("rb") as data:
                    while chunk := data.read(CHUNK):
                        yield chunk
                yield tar_padding(piece.size)
            else:
                yield piece

    @property
    def config_digest(self) -> str:  # the image ID on the classic store (and Engine 20.10)
        return self.ids[0][0]

    @property
    def manifest_digest(self) -> str:  # the image ID on the containerd image store
        return self.ids[0][1]

    def is_image(self, image_id: str) -> bool:
        return image_id in self.ids[0]


def image_layout(
    config: bytes,
    layers: Sequence[tuple[str, Path]],
    *,
    tags: Sequence[str] = (),
    mtime: int = 0,
    omit: frozenset[str] = frozenset(),
) -> ImageLayout:
    """The layout of one image whose layers are (diff_id, tar file) (see ``write_layout``)."""
    files = [Layer(diff_id=diff_id, size=path.stat().st_size, path=path)
             for diff_id, path in layers]
    return write_layout([LayoutImage(config=config, layers=files, tags=tags)], mtime=mtime,
                        omit=omit)


def held_layers_archive(config: bytes, diff_ids: Sequence[str]) -> Iterator[bytes]:
    """A docker-archive of one config and its manifest with every layer left out, for a
    classic store that holds each layer's chain: its ``docker load`` takes such a layer
    from the store and opens no file for it. No OCI index: its manifest needs each layer's
    size, which only a save could tell."""
    manifest = canonical_bytes([{"Config": _blob(sha256_digest(config)), "RepoTags": [],
                                 "Layers": [_blob(d) for d in diff_ids]}])
    yield from tar_member(_blob(sha256_digest(config)), io.BytesIO(config), len(config))
    yield from tar_member("manifest.json", io.BytesIO(manifest), len(manifest))
    yield tar_end()


def write_layout(images: Sequence[LayoutImage], *, mtime: int = 0,
                 omit: frozenset[str] = frozenset()) -> ImageLayout:
    """The OCI layout (plus ``manifest.json``) of several images, in a fixed order.

    Layers go uncompressed (the digest of each blob is its diff_id) and once, however many
    images or places list them, sorted by digest; then the configs and manifests, sorted
    by digest, then index.json, manifest.json and oci-layout: the same images give the
    same bytes on every engine. The layers come first, in an order their diff_ids alone
    decide, so that a writer can put each in its place as soon as it has it (a manifest
    is known only once every layer's size is).
    ``omit``: layer blobs (diff IDs) left out, for a site that holds them already (a delta
    bundle): the documents still name them, so the IDs are those of the whole images.
    """
    manifests = [image.manifest for image in images]
    index = canonical_bytes({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": sha256_digest(manifest), "size": len(manifest),
         **({"annotations": _name_annotations(tag)} if tag else {})}
        for image, manifest in zip(images, manifests, strict=True)
        for tag in (sorted(image.tags) or [""])
    ]})
    docker_manifest = canonical_bytes([{
        "Config": _blob(sha256_digest(image.config)), "RepoTags": sorted(image.tags),
        "Layers": [_blob(layer.diff_id) for layer in image.layers],
    } for image in images])
    ids = tuple((sha256_digest(image.config), sha256_digest(manifest))
                for image, manifest in zip(images, manifests, strict=True))
    return ImageLayout(ids=ids, pieces=_layout_pieces(images, manifests, index,
                                                      docker_manifest, mtime, omit))


def _name_annotations(reference: str) -> dict[str, str]:
    name = reference if "/" in reference.split(":")[0] else f"library/{reference}"
    full = name if "." in name.split("/")[0] else f"docker.io/{name}"
    return {"io.containerd.image.name": full,
            "org.opencontainers.image.ref.name": reference.rpartition(":")[2]}


def _blob(digest: str) -> str:
    return f"blobs/sha256/{digest.removeprefix('sha256:')}"


def layout_layers(diff_ids: Iterable[str]) -> list[str]:
    """The order of the layer blobs in the layout: by digest, each once. A writer that
    knows the layers before their bytes come (bundle.stream) writes each in its place."""
    return sorted(set(diff_ids))


def layer_header(diff_id: str, size: int, *, mtime: int = 0) -> bytes:
    """The tar header of a layer blob of the layout (its body and padding follow it)."""
    return tar_header(_blob(diff_id), size, mtime=mtime)


def _layout_pieces(
    images: Sequence[LayoutImage], manifests: Sequence[bytes], index: bytes,
    docker_manifest: bytes, mtime: int, omit: frozenset[str] = frozenset(),
) -> Iterator[Piece]:
    layers = {layer.diff_id: layer for image in images for layer in image.layers
              if layer.diff_id not in omit}
    for diff_id in layout_layers(layers):
        yield layer_header(diff_id, layers[diff_id].size, mtime=mtime)
        yield layers[diff_id]
    documents = {sha256_digest(d): d for d in [*(i.config for i in images), *manifests]}
    for digest in sorted(documents):
        document = documents[digest]
        yield from tar_member(_blob(digest), io.BytesIO(document), len(document), mtime=mtime)
    layout = b'{"imageLayoutVersion":"1.0.0"}'
    for name, document in (("index.json", index), ("manifest.json", docker_manifest),
                           ("oci-layout", layout)):
        yield from tar_member(name, io.BytesIO(document), len(document), mtime=mtime)
    yield tar_end()


def canonical_bytes(value: object) -> bytes:
    return primitives.canonical_bytes(value, ascii_only=True)
