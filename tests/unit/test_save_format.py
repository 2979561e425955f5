"""One reader for both `docker save` layouts, one writer; on archives real engines wrote.

The fixtures are `docker save` of one two-layer image (an imported file, then COPY) from
Engine 20.10 (docker-archive), Engine 28.5.2 with the classic store and with the containerd
image store (OCI layouts, the latter with gzip layers). Made with (per engine):
    tar cf f.tar f && docker import f.tar h15-tiny:1
    printf 'FROM h15-tiny:1\\nCOPY f /g\\n' | DOCKER_BUILDKIT=0 docker build -t h15-tiny:2 -f- .
    docker save h15-tiny:2 -o <fixture>
(the 20.10 one by loading the classic one and saving it again).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from stackpin.engine import chunk_stream
from stackpin.engine.save_format import image_layout, read_save
from stackpin.errors import HostEnvironmentError

SAVES = Path(__file__).parent / "fixtures" / "save"
CONFIG = "sha256:1ec3b9db0d9c1f7f3b31414332e128a8eada6479c2577d0b9d6b629bc8a6850c"
DIFF_IDS = ("sha256:30810ba066c68e059ded1fb7f2a8eddeb037b9dba6707df4fe68a1f7cc46da8f",
            "sha256:47b98446df233bb3863b260b8fdb02075c4da74ad4383029d7ec567a969f6c0a")
CLASSIC_MANIFEST = "sha256:a8d03fa7ba8949a16a8c3f8df1c8a6f7a01e41306cb9093a1cc29aff0cdf85ae"
CONTAINERD_ID = "sha256:67465d28d836213aed4a9f4664cba27f5ec9d623717d1f64a673b7fa8108d57f"
CONTAINERD_CONFIG = "sha256:03f526f8bdb860a99ee1dc64472c8b3c1cbbc766f47abc02527797aebbd5e052"


def _members(data: io.BufferedIOBase) -> list[str]:
    with tarfile.open(fileobj=data, mode="r|") as tar:
        return [m.name for m in tar]


@pytest.mark.parametrize(("fixture", "layout", "config", "manifest", "compression", "image_id"), [
    ("docker20-archive.tar", "docker-archive", CONFIG, "", "", CONFIG),
    ("docker28-classic-oci.tar", "oci", CONFIG, CLASSIC_MANIFEST, "", CONFIG),
    ("docker28-containerd-oci.tar", "oci", CONTAINERD_CONFIG, CONTAINERD_ID, "gzip",
     CONTAINERD_ID),
])
def test_every_engine_s_save_reads_to_the_same_layers(fixture, layout, config, manifest,
                                                      compression, image_id):
    with (SAVES / fixture).open("rb") as stream:
        contents = read_save(stream, _members)

    assert contents.layout == layout
    (entry,) = contents.entries
    assert (entry.config_digest, entry.manifest_digest) == (config, manifest)
    assert entry.repo_tags == ("h15-tiny:2",)
    assert contents.entry_for(image_id) is entry  # the ID the engine reports finds it
    layers = contents.layers_of(entry)
    assert tuple(layer.diff_id for layer in layers) == DIFF_IDS == tuple(
        entry.config["rootfs"]["diff_ids"])
    assert {layer.compression for layer in layers} == {compression}
    assert [layer.value for layer in layers] == [["f"], ["g"]]  # handed over uncompressed


def test_an_image_the_archive_lacks_is_named():
    with (SAVES / "docker20-archive.tar").open("rb") as stream:
        contents = read_save(stream, _members)
    with pytest.raises(HostEnvironmentError, match=r"holds no image sha256:0+"):
        contents.entry_for("sha256:" + "0" * 64)


def _archive(files: dict[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


@pytest.mark.parametrize(("damage", "message"), [
    ("no-manifest", "has no manifest.json"),
    ("missing-layer", "lacks the layer"),
    ("cut", "cannot be read"),
    ("bad-gzip", "cannot be read"),
])
def test_a_damaged_save_stream_is_one_error(damage, message):
    layer = _archive({"f": b"x"}).getvalue()
    config = json.dumps({"rootfs": {"diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}})
    files = {"blobs/sha256/aa": gzip.compress(layer), "blobs/sha256/cc": config.encode(),
             "index.json": b'{"manifests": []}',
             "manifest.json": json.dumps([{"Config": "blobs/sha256/cc",
                                           "Layers": ["blobs/sha256/aa"]}]).encode()}
    if damage == "no-manifest":
        del files["manifest.json"]
    if damage == "missing-layer":
        del files["blobs/sha256/aa"]
    if damage == "bad-gzip":
        files["blobs/sha256/aa"] = gzip.compress(layer)[:30]
    data = _archive(files).getvalue()
    if damage == "cut":
        data = data[:700]
    with pytest.raises(HostEnvironmentError, match=message):
        read_save(io.BytesIO(data), _members)


def test_the_written_layout_reads_back_with_both_ids_known_beforehand(tmp_path: Path):
    layer = tmp_path / "l.tar"
    layer.write_bytes(_archive({"opt/a": b"1"}).getvalue())
    diff_id = "sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest()
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [diff_id, diff_id]}}).encode()

    written = image_layout(config, [(diff_id, layer), (diff_id, layer)], tags=("x/y:1",))
    data = b"".join(written.chunks)
    contents = read_save(chunk_stream([data]), _members)

    (entry,) = contents.entries
    assert entry.config_digest == written.config_digest
    assert entry.manifest_digest == written.manifest_digest
    assert written.config_digest == "sha256:" + hashlib.sha256(config).hexdigest()
    assert entry.repo_tags == ("x/y:1",)
    assert [layer.diff_id for layer in contents.layers_of(entry)] == [diff_id, diff_id]
    assert list(contents.layers) == [f"blobs/sha256/{diff_id[7:]}"]  # stored once
    index = json.loads(_archive_files(data)["index.json"])
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == (
        "docker.io/x/y:1")


def _archive_files(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
