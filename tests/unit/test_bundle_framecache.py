"""Layer frames kept between exports: copied only for the very bytes they were made from.

Each test holds a broken cache to what it must do: a second export compresses nothing it
compressed before and writes the same bytes as an export without the cache; a damaged
frame, a save blob whose bytes are not its name, a record without its frame, or a cache
of another zstd level never reach a bundle.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bundle_fakes import layer_bytes
from tests.fake_engine import FakeEngine

from stackpin.bundle import stream as streaming
from stackpin.bundle.format import ZSTD_LEVEL
from stackpin.bundle.framecache import FrameCache
from stackpin.engine import SaveRequest, chunk_stream
from stackpin.engine.save_format import ZSTD_MAGIC, KnownLayer, read_save
from stackpin.errors import BundleError, HostEnvironmentError

NAMES = ["x:1", "y:1"]


def _engine(kind: str) -> FakeEngine:
    engine = FakeEngine(kind=kind)
    engine.add({"n": "a"}, [layer_bytes("shared", 8192), layer_bytes("odd", 1000)],
               tags=("x:1",))
    engine.add({"n": "b"}, [layer_bytes("shared", 8192), layer_bytes("b", 4096)],
               tags=("y:1",))
    return engine


def _export(engine: FakeEngine, path: Path, cache: Path | None,
            compressed: list[int] | None = None,
            monkeypatch: pytest.MonkeyPatch | None = None, names: list[str] = NAMES) -> bytes:
    """Export NAMES to ``path``; ``compressed`` collects the size of each layer compressed."""
    if monkeypatch is not None and compressed is not None:
        keep = streaming.FrameSpool.keep

        def counting(spool: streaming.FrameSpool, data: io.BufferedIOBase,
                     ) -> streaming.SpooledLayer:
            spooled = keep(spool, data)
            compressed.append(spooled.size)
            return spooled

        monkeypatch.setattr(streaming.FrameSpool, "keep", counting)
    streaming.write_images(engine, names, path, threads=1, frame_cache=cache)
    return path.read_bytes()


def _frames(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/*.zst"))


@pytest.mark.parametrize("kind", ["classic", "containerd", "docker20"])
def test_a_second_export_compresses_no_layer_and_writes_the_same_bytes(tmp_path, kind,
                                                                      monkeypatch):
    engine = _engine(kind)
    reference = _export(engine, tmp_path / "plain.zst", cache=None)
    first: list[int] = []
    assert _export(engine, tmp_path / "1.zst", tmp_path / "cache", first, monkeypatch) == reference
    assert len(first) == 3 and len(_frames(tmp_path / "cache")) == 3  # the shared layer once
    second: list[int] = []
    assert _export(engine, tmp_path / "2.zst", tmp_path / "cache", second, monkeypatch) == reference
    assert second == []
    # One new layer: only it is compressed; the bundle is still the one made without a cache.
    engine.add({"n": "c"}, [layer_bytes("shared", 8192), layer_bytes("new", 2048)],
               tags=("z:1",))
    names = [*NAMES, "z:1"]
    streaming.write_images(engine, names, tmp_path / "plain3.zst", threads=1)
    third: list[int] = []
    _export(engine, tmp_path / "3.zst", tmp_path / "cache", third, monkeypatch, names=names)
    assert third == [2048]
    assert (tmp_path / "3.zst").read_bytes() == (tmp_path / "plain3.zst").read_bytes()


def _heads_alike(tail: str) -> bytes:
    """A layer of 2 MiB whose first MiB is every such layer's: only its tail tells it."""
    return bytes(1 << 20) + layer_bytes(tail, 1 << 20)


def test_a_docker_archive_layer_of_a_kept_ones_size_and_head_is_read_again_not_trusted(
        tmp_path, monkeypatch):
    # Engine 20.10 names a layer <v1 id>/layer.tar: its size and first MiB are the guess at
    # which kept frame it is. A layer that begins as a kept one and then differs has been
    # hashed, not compressed, by then: the save is read again, trusting no guess.
    cache = tmp_path / "cache"
    first = FakeEngine(kind="docker20")
    first.add({"n": "a"}, [_heads_alike("a")], tags=("x:1",))
    _export(first, tmp_path / "a.zst", cache, names=["x:1"])
    engine = FakeEngine(kind="docker20")
    engine.add({"n": "b"}, [_heads_alike("b")], tags=("x:1",))
    reference = _export(engine, tmp_path / "plain.zst", cache=None, names=["x:1"])
    saves = 0
    save = engine.save

    def counting(request: SaveRequest) -> Iterator[bytes]:
        nonlocal saves
        saves += 1
        yield from save(request)

    engine.save = counting  # type: ignore[method-assign]
    compressed: list[int] = []
    assert _export(engine, tmp_path / "b.zst", cache, compressed, monkeypatch,
                   names=["x:1"]) == reference
    assert saves == 2 and compressed == [2 << 20]
    # The head now names the layer it was last: the next export compresses nothing.
    again: list[int] = []
    assert _export(engine, tmp_path / "b2.zst", cache, again, names=["x:1"]) == reference
    assert again == [] and saves == 3


def test_a_damaged_frame_fails_the_export_is_removed_and_the_next_export_mends_it(tmp_path):
    engine = _engine("classic")
    reference = _export(engine, tmp_path / "plain.zst", cache=None)
    _export(engine, tmp_path / "1.zst", tmp_path / "cache")
    victim = max(_frames(tmp_path / "cache"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only its digest can tell
    victim.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="is damaged and was removed: run the export again"):
        _export(engine, tmp_path / "2.zst", tmp_path / "cache")
    assert not victim.exists() and not victim.with_suffix(".json").exists()
    assert _export(engine, tmp_path / "3.zst", tmp_path / "cache") == reference
    assert victim.exists()


def test_a_frame_without_its_record_or_of_another_size_is_not_used(tmp_path):
    engine = _engine("classic")
    _export(engine, tmp_path / "1.zst", tmp_path / "cache")
    frames = _frames(tmp_path / "cache")
    frames[0].with_suffix(".json").unlink()  # a put cut short before its record
    record = frames[1].with_suffix(".json")
    fields = json.loads(record.read_text())
    record.write_text(json.dumps({**fields, "bytes": fields["bytes"] + 1}))  # truncated frame
    cache = FrameCache(tmp_path / "cache", level=ZSTD_LEVEL)
    blobs = [f"sha256:{f.stem}" for f in frames]
    assert [cache.get(b) is None for b in blobs] == [True, True, False]
    assert cache.get("sha256:" + "0" * 64) is None
    assert cache.get("../../etc/passwd") is None


def test_frames_of_another_level_are_another_cache(tmp_path):
    engine = _engine("classic")
    _export(engine, tmp_path / "1.zst", tmp_path / "cache")
    blob = f"sha256:{_frames(tmp_path / 'cache')[0].stem}"
    assert FrameCache(tmp_path / "cache", level=ZSTD_LEVEL).get(blob) is not None
    assert FrameCache(tmp_path / "cache", level=ZSTD_LEVEL + 1).get(blob) is None


def test_a_blob_whose_bytes_are_not_its_name_is_refused_though_a_frame_is_kept(tmp_path):
    engine = _engine("classic")
    save = b"".join(engine.save(SaveRequest(images=tuple(NAMES))))
    with tarfile.open(fileobj=io.BytesIO(save)) as tar:
        member = next(m for m in tar if m.name.startswith("blobs/")
                      and layer_bytes("odd", 1000)[:16] in tar.extractfile(m).read())
    name = member.name.encode()
    start = save.index(name)  # the member's header; its body starts one block on
    body = start - start % 512 + 512
    damaged = bytearray(save)
    damaged[body + 100] ^= 0xFF
    blob = f"sha256:{member.name.rsplit('/', 1)[1]}"
    held = KnownLayer(diff_id=blob, value="kept")

    def known(name: str) -> KnownLayer[str] | None:
        return held if name == blob else None

    with pytest.raises(HostEnvironmentError, match=f"sent blob {blob} with other bytes"):
        read_save(chunk_stream(iter([bytes(damaged)])), lambda d: "read", known=known)
    # The same stream undamaged: the kept value stands in, nothing else does.
    contents = read_save(chunk_stream(iter([save])), lambda d: "read", known=known)
    values = sorted(layer.value for layer in contents.layers.values())
    assert values == ["kept", "read", "read"]
    assert all(layer.blob for layer in contents.layers.values())


def test_the_least_recently_used_frames_go_first_past_the_size(tmp_path):
    engine = _engine("classic")
    _export(engine, tmp_path / "1.zst", tmp_path / "cache")
    frames = _frames(tmp_path / "cache")
    sizes = {f: f.stat().st_size for f in frames}
    for age, frame in enumerate(frames):  # frames[0] used longest ago
        os.utime(frame.with_suffix(".json"), (1000 + age, 1000 + age))
    keep = sizes[frames[1]] + sizes[frames[2]]
    FrameCache(tmp_path / "cache", level=ZSTD_LEVEL, keep_bytes=keep).trim()
    assert _frames(tmp_path / "cache") == frames[1:]
    assert not frames[0].with_suffix(".json").exists()


def test_a_record_naming_another_diff_id_for_an_uncompressed_blob_is_not_believed(tmp_path):
    # An uncompressed blob is named by its own diff_id: a record saying otherwise is wrong,
    # and its layer is compressed again (and its record mended) instead of trusted.
    engine = _engine("classic")
    reference = _export(engine, tmp_path / "plain.zst", cache=None)
    _export(engine, tmp_path / "1.zst", tmp_path / "cache")
    record = _frames(tmp_path / "cache")[0].with_suffix(".json")
    fields = json.loads(record.read_text())
    record.write_text(json.dumps({**fields, "diff_id": "sha256:" + "1" * 64}))
    assert _export(engine, tmp_path / "2.zst", tmp_path / "cache") == reference
    assert json.loads(record.read_text())["diff_id"] == fields["diff_id"]


def test_a_cache_that_cannot_be_written_leaves_the_bundle_whole(tmp_path):
    engine = _engine("classic")
    reference = _export(engine, tmp_path / "plain.zst", cache=None)
    (tmp_path / "cache").write_text("a file where the cache folder would go")
    assert _export(engine, tmp_path / "1.zst", tmp_path / "cache") == reference


@pytest.mark.parametrize("kind", ["classic", "containerd"])
def test_blobs_are_named_only_for_a_caller_that_holds_layers(kind):
    # Naming a gzip blob costs a second sha256 over its compressed bytes: a reader that
    # passes no ``known`` (rebuild, unpack, an export with --no-cache) does not pay it.
    save = b"".join(_engine(kind).save(SaveRequest(images=tuple(NAMES))))
    plain = read_save(chunk_stream(iter([save])), lambda d: d.read())
    asking = read_save(chunk_stream(iter([save])), lambda d: d.read(), known=lambda b: None)
    assert [layer.blob for layer in plain.layers.values()] == ["", "", ""]
    assert [layer.blob for layer in asking.layers.values()] == [
        f"sha256:{name.rsplit('/', 1)[1]}" for name in asking.layers]
    assert {n: (x.diff_id, x.value) for n, x in plain.layers.items()} == {
        n: (x.diff_id, x.value) for n, x in asking.layers.items()}


class _Phases:
    """A meter that keeps each phase's label, total and count; ``on_finish`` runs at the
    end of each phase, with its label."""

    def __init__(self, on_finish=lambda label: None) -> None:
        self.phases: list[list[object]] = []
        self._on_finish = on_finish

    def start(self, label: str, total: int, *, estimate: bool = False) -> None:
        self.phases.append([label, total, 0])

    def advance(self, count: int) -> None:
        self.phases[-1][2] += count  # type: ignore[operator]

    def finish(self) -> None:
        self._on_finish(self.phases[-1][0])


def _layer_frames(data: bytes) -> int:
    """Bytes of ``data`` before its last frame (the documents'): headers and layers."""
    return data.rfind(ZSTD_MAGIC)


@pytest.mark.parametrize("kind", ["classic", "containerd", "docker20"])
def test_kept_frames_are_written_while_the_daemon_prepares_the_save(tmp_path, kind):
    # The save request goes out first; every layer's kept frame is in the file before the
    # save's first byte is read (the daemon is silent that long: 22-25 s for CUDA images).
    engine = _engine(kind)
    reference = _export(engine, tmp_path / "plain.zst", cache=None)
    _export(engine, tmp_path / "1.zst", tmp_path / "cache")
    requested, kept = threading.Event(), threading.Event()
    out = tmp_path / "2.zst"
    sizes_at_first_byte: list[int] = []
    save = engine.save

    def slow_daemon(request: SaveRequest) -> Iterator[bytes]:
        requested.set()
        assert kept.wait(30), "the kept frames were not written before the first byte"
        sizes_at_first_byte.append(out.stat().st_size)
        yield from save(request)

    def on_finish(label: str) -> None:
        if label == "kept":
            assert requested.wait(30), "the save was asked for only after the kept frames"
            kept.set()

    engine.save = slow_daemon  # type: ignore[method-assign]
    meter = _Phases(on_finish)
    streaming.write_images(engine, NAMES, out, threads=1, frame_cache=tmp_path / "cache",
                           meter=meter)
    data = out.read_bytes()
    assert data == reference
    assert sizes_at_first_byte == [_layer_frames(data)]
    layers = sum(f.stat().st_size for f in _frames(tmp_path / "cache"))
    assert meter.phases[0] == ["kept", layers, layers]


def test_an_engine_20_10_writes_frames_another_engine_kept_ahead_then_finds_its_own(
        tmp_path, monkeypatch):
    # Frames kept by a Docker 28 export are found by diff_id and written ahead; 20.10's
    # layer.tar names are new to the cache, so its layers are compressed once more, into
    # the same bytes (the file is not written again), and are found by their heads after.
    cache = tmp_path / "cache"
    _export(_engine("classic"), tmp_path / "1.zst", cache)
    engine = _engine("docker20")
    reference = _export(engine, tmp_path / "plain.zst", cache=None)
    meter = _Phases()
    streaming.write_images(engine, NAMES, tmp_path / "2.zst", threads=1, frame_cache=cache,
                           meter=meter)
    assert (tmp_path / "2.zst").read_bytes() == reference
    layers = sum(f.stat().st_size for f in _frames(cache))
    assert meter.phases[0] == ["kept", layers, layers]
    # Only the documents' frame is written after the save: not the layers again.
    rest = len(reference) - _layer_frames(reference)
    assert meter.phases[-1] == ["write", rest, rest]
    compressed: list[int] = []
    assert _export(engine, tmp_path / "3.zst", cache, compressed, monkeypatch) == reference
    assert compressed == []


@pytest.mark.parametrize("kind", ["classic", "docker20"])
def test_a_record_of_another_size_for_an_uncompressed_blob_is_not_believed(tmp_path, kind):
    # Its frame was written ahead under a header of the wrong size: the layout the save
    # gives differs from that start, so the file is written again, and the record mended.
    engine = _engine(kind)
    reference = _export(engine, tmp_path / "plain.zst", cache=None)
    _export(engine, tmp_path / "1.zst", tmp_path / "cache")
    record = _frames(tmp_path / "cache")[0].with_suffix(".json")
    fields = json.loads(record.read_text())
    record.write_text(json.dumps({**fields, "size": fields["size"] + 512}))
    compressed: list[int] = []
    monkeypatch = pytest.MonkeyPatch()
    try:
        assert _export(engine, tmp_path / "2.zst", tmp_path / "cache", compressed,
                       monkeypatch) == reference
    finally:
        monkeypatch.undo()
    assert compressed == [fields["size"]]
    assert json.loads(record.read_text())["size"] == fields["size"]


def test_a_compressed_blob_finds_its_frame_through_its_alias_and_trim_drops_the_orphans(
        tmp_path):
    engine = _engine("containerd")
    _export(engine, tmp_path / "1.zst", tmp_path / "cache")
    folder = next((tmp_path / "cache").iterdir())
    aliases = sorted(folder.glob("*.alias"))
    assert len(aliases) == 3  # every gzip blob names its layer's frame
    cache = FrameCache(tmp_path / "cache", level=ZSTD_LEVEL)
    for alias in aliases:
        found = cache.get(f"sha256:{alias.stem}")
        assert found is not None and found.path.stem == alias.read_text().split(":")[1]
    cache.forget(aliases[0].read_text())
    assert cache.get(f"sha256:{aliases[0].stem}") is None
    cache.trim()
    assert sorted(folder.glob("*.alias")) == aliases[1:]
