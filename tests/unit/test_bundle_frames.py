"""images.tar.zst as concatenated zstd frames, each layer compressed while it is spooled.

The reference for every byte is the raw layout: the same save read into uncompressed
layer files and written by ``save_format.write_layout`` (what the bundle decompressed to
before the layers were framed, and what a load checks against the manifest's tar_bytes).
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard
from test_bundle_fakes import layer_bytes, unzstd
from tests.fake_engine import FakeEngine

from stackpin.bundle import stream as streaming
from stackpin.engine import SaveRequest, chunk_stream
from stackpin.engine.save_format import ZSTD_MAGIC, Layer, LayoutImage, read_save, write_layout
from stackpin.engine.types import ImageInfo
from stackpin.errors import HostEnvironmentError
from stackpin.primitives import tar_padding

SHARED = layer_bytes("shared", 8192)  # a multiple of 512: no padding
ODD = layer_bytes("odd", 1000)  # padded with 24 zeros
EMPTY = b""  # a body of no bytes: a frame that decompresses to nothing
NAMES = ["x:1", "x:2", "y:1"]


def _engine(kind: str = "docker20") -> FakeEngine:
    engine = FakeEngine(kind=kind)
    engine.add({"n": "a"}, [SHARED, ODD], tags=("x:1",))
    engine.add({"n": "b"}, [SHARED, EMPTY, layer_bytes("b", 4096)], tags=("y:1", "x:2"))
    return engine


def _raw_layout(engine: FakeEngine, folder: Path) -> bytes:
    """The save, its layers kept as raw tar files, written as the layout's raw chunks."""
    names = iter(range(1000))

    def keep(data: io.BufferedIOBase) -> Path:
        path = folder / f"{next(names)}.tar"
        path.write_bytes(data.read())
        return path

    saved = read_save(chunk_stream(engine.save(SaveRequest(images=tuple(sorted(NAMES))))), keep)
    entries = sorted(saved.entries, key=lambda e: e.config_digest)
    layout = write_layout([LayoutImage(
        config=entry.config_bytes, tags=entry.repo_tags,
        layers=[Layer(diff_id=layer.diff_id, size=layer.value.stat().st_size, path=layer.value)
                for layer in saved.layers_of(entry)],
    ) for entry in entries])
    return b"".join(layout.chunks)


def _frames(data: bytes) -> list[tuple[bytes, bytes]]:
    """(compressed frame, its content) for each frame of ``data``, in order."""
    frames = []
    while data:
        reader = zstandard.ZstdDecompressor().decompressobj()
        content = reader.decompress(data)
        assert reader.eof, "a frame cut short"
        frames.append((data[: len(data) - len(reader.unused_data)], content))
        data = reader.unused_data
    return frames


def _export(engine: FakeEngine, path: Path, threads: int = 1) -> bytes:
    stats, _ = streaming.write_images(engine, NAMES, path, threads=threads)
    data = path.read_bytes()
    assert (stats.bytes, stats.tar_bytes) == (len(data), len(unzstd(data)))
    return data


@pytest.mark.parametrize("kind", ["docker20", "classic", "containerd"])
def test_the_frames_decompress_to_the_raw_layout_byte_for_byte(tmp_path, kind):
    (tmp_path / "raw").mkdir()
    expected = _raw_layout(_engine(kind), tmp_path / "raw")
    data = _export(_engine(kind), tmp_path / "images.tar.zst")
    assert unzstd(data) == expected
    # The zstd CLI (what the site's load.sh pipes into docker load) reads every frame too.
    done = subprocess.run(["zstd", "-dc"], input=data, capture_output=True, check=True)
    assert done.stdout == expected


def test_each_layer_is_its_own_frame_copied_as_it_was_compressed(tmp_path):
    frames = _frames(_export(_engine(), tmp_path / "images.tar.zst"))
    compressor = streaming.frame_compressor(1)
    for layer in (SHARED, ODD, EMPTY, layer_bytes("b", 4096)):
        alone = io.BytesIO()
        streaming.compress_frame(compressor, [layer, tar_padding(len(layer))], alone)
        # The body and its padding in one frame, once (the shared layer too), verbatim.
        assert [f for f, _ in frames].count(alone.getvalue()) == 1
    layers = {SHARED, ODD + tar_padding(len(ODD)), EMPTY, layer_bytes("b", 4096)}
    between = [content for _, content in frames if content not in layers]
    # Four layers, so at most five frames of the layout's own bytes: headers and documents
    # between two layers go in one frame, none of them holds a layer's bytes.
    assert len(frames) == 4 + len(between) and len(between) <= 5
    assert all(content and SHARED not in content for content in between)


def test_a_shared_layer_is_written_once(tmp_path):
    raw = unzstd(_export(_engine(), tmp_path / "images.tar.zst"))
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        bodies = [tar.extractfile(m).read() for m in tar if m.name.startswith("blobs/")]
    assert bodies.count(SHARED) == 1
    contents = read_save(io.BytesIO(raw), lambda data: data.read())
    assert [len(contents.layers_of(e)) for e in contents.entries] in ([2, 3], [3, 2])


def test_the_bytes_do_not_depend_on_the_zstd_worker_count(tmp_path):
    engine = _engine()
    # Larger than one of zstd's multi-threaded jobs (8 MiB at level 3), so that several
    # workers really split it.
    engine.add({"n": "big"}, [layer_bytes("big", 20 << 20)], tags=("z:1",))
    outputs = set()
    for threads in (1, 2, 4):
        stats, _ = streaming.write_images(engine, [*NAMES, "z:1"], tmp_path / f"{threads}.zst",
                                          threads=threads)
        outputs.add((tmp_path / f"{threads}.zst").read_bytes())
        assert stats.bytes < 12 << 20  # the zeros half of the big layer was compressed
    assert len(outputs) == 1


def test_the_spool_is_removed_after_an_export_and_after_a_failed_one(tmp_path):
    _export(_engine(), tmp_path / "images.tar.zst")
    assert [p.name for p in tmp_path.iterdir()] == ["images.tar.zst"]
    engine = _engine()
    data = b"".join(engine.save(SaveRequest(images=tuple(sorted(NAMES)))))
    kept: list[Path] = []
    keep = streaming.FrameSpool.keep

    def spy(spool: streaming.FrameSpool, data: io.BufferedIOBase) -> streaming.SpooledLayer:
        spooled = keep(spool, data)
        kept.append(spooled.path)
        return spooled

    engine.save = lambda request: iter([data[: len(data) // 2]])  # type: ignore[method-assign]
    failed = tmp_path / "failed"
    failed.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(streaming.FrameSpool, "keep", spy)
        with pytest.raises(HostEnvironmentError, match="save stream"):  # cut: no manifest
            streaming.write_images(engine, NAMES, failed / "images.tar.zst", threads=1)
    assert kept and not any(path.exists() for path in kept)  # a layer was spooled, then gone
    assert list(failed.iterdir()) == []


class _Phases:
    def __init__(self) -> None:
        self.totals: dict[str, int] = {}

    def start(self, label: str, total: int, *, estimate: bool = False) -> None:
        self.totals[label] = total

    def advance(self, count: int) -> None:
        pass

    def finish(self) -> None:
        pass


def _left_after_the_save(engine: FakeEngine, path: Path) -> tuple[int, bytes]:
    """What the export wrote after the save had ended, and the whole file."""
    meter = _Phases()
    streaming.write_images(engine, NAMES, path, threads=1, meter=meter)
    return meter.totals["write"], path.read_bytes()


def test_layers_sent_in_the_layouts_order_are_written_while_the_save_runs(tmp_path):
    # A classic store sends its blobs sorted by digest, and its layers are named by their
    # diff_ids: the layout's order. Each is written as it ends, and only the documents'
    # frame is left when the save ends.
    left, data = _left_after_the_save(_engine("classic"), tmp_path / "classic.zst")
    assert 0 < left == len(data) - data.rfind(ZSTD_MAGIC)


def test_a_layer_the_configs_did_not_name_makes_the_file_be_written_again_the_same(tmp_path):
    # The order is taken from the images' configs before the save; a save that brings a
    # layer they did not name (an image retagged meanwhile, an engine that lies) makes what
    # was written early wrong: the file is written again from its first byte.
    engine = _engine("classic")
    reference = _export(engine, tmp_path / "plain.zst")
    info = engine.image_info

    def missing_one(reference: str) -> ImageInfo | None:
        found = info(reference)
        return None if found is None else replace(found, diff_ids=found.diff_ids[1:])

    engine.image_info = missing_one  # type: ignore[method-assign]
    left, data = _left_after_the_save(engine, tmp_path / "again.zst")
    assert data == reference and left == len(data)
