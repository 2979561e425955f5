"""Byte progress: what the meters count (every byte, to the real total) and how it is shown
(click's bar on a terminal, plain periodic lines otherwise)."""

from __future__ import annotations

import functools
import io
import re
import tarfile

import pytest
from click.testing import CliRunner
from test_bundle_fakes import engine_with_cpu, export_cpu, layer_bytes, site_trusting, unzstd
from tests.fake_engine import FakeEngine

from stackpin.bundle import export as exporting
from stackpin.bundle import load as loading
from stackpin.bundle import stream as streaming
from stackpin.bundle import verify as verifying
from stackpin.cli.main import cli
from stackpin.cli.progress import MIB, ByteProgress
from stackpin.engine import SaveRequest
from stackpin.engine.save_format import ZSTD_MAGIC


class Recorder:
    """A meter that keeps every call: phases with their total and what was counted."""

    def __init__(self) -> None:
        self.phases: list[list[object]] = []  # [label, total, counted, finished]
        self.estimates: set[str] = set()  # the labels whose total was said to be estimated

    def start(self, label: str, total: int, *, estimate: bool = False) -> None:
        self.phases.append([label, total, 0, False])
        if estimate:
            self.estimates.add(label)

    def advance(self, count: int) -> None:
        assert not self.phases[-1][3], "advance after finish"
        self.phases[-1][2] += count  # type: ignore[operator]

    def finish(self) -> None:
        self.phases[-1][3] = True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# --- what is counted ------------------------------------------------------------------


def test_export_counts_the_whole_save_stream_and_every_byte_written(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells)
    names = [engine.list_images("io.stackpin.cell")[0].tags[0]]
    saved = sum(len(chunk) for chunk in engine.save(SaveRequest(images=tuple(names))))
    meter = Recorder()
    stats, _ = streaming.write_images(engine, names, tmp_path / "images.tar.zst", threads=1,
                                      meter=meter)
    (save, write) = meter.phases
    assert save[0] == "save" and save[2] == saved and save[3]
    assert save[1] == engine.image_info(names[0]).size  # the estimate: the image's size
    assert meter.estimates == {"save"}
    # Compression runs during the save, and the layers, sent in the layout's order (a
    # classic store's save), are written as each ends: what is left to write after the
    # save is the documents' frame, its total exact before it starts.
    documents = stats.bytes - (tmp_path / "images.tar.zst").read_bytes().rfind(ZSTD_MAGIC)
    assert write == ["write", documents, documents, True]


def test_an_image_named_by_each_of_its_tags_is_estimated_once(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells)
    image = engine.list_images("io.stackpin.cell")[0]
    assert len(image.tags) == 2  # what a build gives it, and what export names
    meter = Recorder()
    streaming.write_images(engine, list(image.tags), tmp_path / "images.tar.zst", threads=1,
                           meter=meter)
    assert meter.phases[0][1] == image.size  # not once per tag: the 0/4076 of 2103 MiB


def shared_variants(kind: str) -> tuple[FakeEngine, list[bytes]]:
    """Two images sharing their first two layers (as stable and enhanced do), with the
    history a build gives them: a step without a layer between ones with files."""
    layers = [layer_bytes(seed, 1 << 20) for seed in ("base", "torch", "sdpa", "flash")]
    engine = FakeEngine(kind=kind)
    history = [{"created_by": "base"}, {"created_by": "ENV X=1", "empty_layer": True},
               {"created_by": "torch"}, {"created_by": "attention"}]
    for name, top in (("stable", layers[2]), ("enhanced", layers[3])):
        engine.add({"architecture": "amd64", "os": "linux", "config": {}, "history": history},
                   [*layers[:2], top], tags=[f"stackpin/x:{name}"])
    return engine, layers


@pytest.mark.parametrize("kind", ["docker20", "classic", "containerd"])
def test_images_sharing_layers_are_estimated_with_each_layer_once(tmp_path, kind):
    engine, layers = shared_variants(kind)
    meter = Recorder()
    streaming.write_images(engine, ["stackpin/x:stable", "stackpin/x:enhanced"],
                           tmp_path / "images.tar.zst", threads=1, meter=meter)
    (_, estimate, counted, _), *_ = meter.phases
    # Four layers, not six (gzip on the containerd store): what came is those and the tar
    # headers and documents, a few KiB more.
    assert estimate < counted < estimate + (64 << 10)
    if kind != "containerd":
        assert estimate == sum(map(len, layers))


def test_an_image_whose_history_does_not_pair_with_its_layers_counts_whole(tmp_path):
    engine, layers = shared_variants("classic")
    lone = engine.add({"architecture": "amd64", "os": "linux", "config": {}},
                      [layer_bytes("lone", 1 << 20)], tags=["stackpin/y:1"])
    assert streaming.save_estimate(engine, ["stackpin/y:1", "stackpin/x:stable"]) == (
        engine.image_info(lone).size + sum(map(len, layers[:3])))
    # A layer of whiteouts alone: its step says 0 bytes, and it is not the empty layer.
    record = engine.image_record("stackpin/x:stable")
    assert streaming.layer_sizes((*record.diff_ids, "sha256:" + "a" * 64),
                                 record.history) is None
    assert streaming.layer_sizes((*record.diff_ids, streaming.EMPTY_LAYER),
                                 record.history) == {
        **dict(zip(record.diff_ids, map(len, layers[:3]), strict=True)),
        streaming.EMPTY_LAYER: 0}


def test_every_exact_total_of_an_export_is_what_its_phase_counted(tmp_path, shipped_cells,
                                                                  monkeypatch):
    meter = Recorder()
    monkeypatch.setattr(exporting, "export", functools.partial(exporting.export, meter=meter))
    export_cpu(tmp_path, shipped_cells)
    assert [p[0] for p in meter.phases] == ["save", "write"]
    exact = [p for p in meter.phases if p[0] not in meter.estimates]
    assert [p[0] for p in exact] == ["write"]
    assert all(total == counted and finished for _, total, counted, finished in exact)


def test_verify_counts_every_byte_of_a_folder_and_of_an_archive(tmp_path, shipped_cells):
    result, public = export_cpu(tmp_path, shipped_cells, archive=True)
    for source, expected in ((result.out_dir, None), (result.archive, result.archive)):
        meter = Recorder()
        verified = verifying.verify(source, site=site_trusting(public), meter=meter)
        ((label, total, counted, finished),) = meter.phases
        size = expected.stat().st_size if expected else verified.bytes
        assert (label, total, counted, finished) == ("verify", size, size, True)


def test_load_counts_the_verification_then_every_byte_the_engine_reads(tmp_path,
                                                                      shipped_cells):
    result, public = export_cpu(tmp_path, shipped_cells, archive=False)
    engine = engine_with_cpu(shipped_cells)
    meter = Recorder()
    loading.load(engine, result.out_dir, site=site_trusting(public), meter=meter)
    (verify, load) = meter.phases
    assert verify[0] == "verify" and verify[3]
    (loaded,) = engine.loaded
    assert load == ["load", len(loaded), len(loaded), True]
    compressed = (result.out_dir / "images.tar.zst").read_bytes()
    assert len(loaded) == len(unzstd(compressed))


# --- how it is shown ------------------------------------------------------------------------


def test_plain_lines_once_started_every_interval_and_at_the_end_with_the_real_total():
    out, clock = io.StringIO(), Clock()
    progress = ByteProgress(stream=out, tty=False, interval_s=10, clock=clock)
    progress.start("save", 100 * MIB)  # lower than what comes
    assert out.getvalue() == ""  # nothing counted yet: nothing to show
    for _ in range(12):
        clock.now += 2
        progress.advance(10 * MIB)
    progress.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "save: 20/100 MiB (20%), 5.0 MiB/s, ETA 16 s"  # min_bytes counted
    assert lines[1] == "save: 70/100 MiB (70%), 5.0 MiB/s, ETA 6 s"  # 10 s after line 0
    assert lines[2] == "save: 120/120 MiB (100%), 5.0 MiB/s"  # 10 s later; the total grew
    assert lines[-1] == "save: 120/120 MiB (100%), 5.0 MiB/s in 24 s"  # the total grew
    assert len(lines) == 4


def test_the_engines_silence_before_the_first_byte_is_no_rate_and_no_eta():
    """Docker 20.10 writes every layer out before `docker save` sends a byte: timing that
    wait as throughput showed `save: 0/4076 MiB ... ETA 2291675 s`."""
    out, clock = io.StringIO(), Clock()
    # min_bytes=1: from the first chunk on (the default waits for 16 MiB of real work).
    progress = ByteProgress(stream=out, tty=False, interval_s=10, clock=clock, min_bytes=1)
    progress.start("save", 4000 * MIB, estimate=True)
    clock.now += 25
    progress.advance(1 * MIB)  # the first chunk, 25 s after the start
    for _ in range(10):
        clock.now += 1
        progress.advance(100 * MIB)
    progress.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "save: 1/~4000 MiB (0%)"  # bytes, but no rate yet
    assert lines[1] == "save: 1001/~4000 MiB (25%), 100.0 MiB/s, ETA ~30 s"
    assert lines[-1] == "save: 1001/1001 MiB (100%), 100.0 MiB/s in 35 s"


def test_no_eta_until_a_share_of_an_exact_total_has_come():
    out, clock = io.StringIO(), Clock()
    progress = ByteProgress(stream=out, tty=False, interval_s=10, clock=clock, min_bytes=1)
    progress.start("load", 10_000 * MIB)
    clock.now += 1
    progress.advance(1 * MIB)
    clock.now += 10
    progress.advance(10 * MIB)  # 0.1 %: a rate, but an ETA would be a guess
    clock.now += 10
    progress.advance(300 * MIB)  # 3 %
    lines = out.getvalue().splitlines()
    assert lines[1] == "load: 11/10000 MiB (0%), 1.0 MiB/s"
    assert lines[2] == "load: 311/10000 MiB (3%), 15.5 MiB/s, ETA 625 s"


def test_an_estimate_above_what_came_ends_at_100_percent_of_what_came():
    out, clock = io.StringIO(), Clock()
    progress = ByteProgress(stream=out, tty=False, clock=clock)
    progress.start("save", 500 * MIB, estimate=True)
    clock.now += 4
    progress.advance(100 * MIB)
    clock.now += 4
    progress.advance(100 * MIB)
    progress.finish()
    assert out.getvalue().splitlines()[-1] == "save: 200/200 MiB (100%), 25.0 MiB/s in 8 s"


def test_a_terminal_gets_clicks_bar_with_done_total_rate_percent_and_eta():
    out, clock = Terminal(), Clock()
    progress = ByteProgress(stream=out, interval_s=10, clock=clock)
    assert progress.tty
    progress.start("verify", 400 * MIB)
    for _ in range(3):
        clock.now += 1
        progress.advance(100 * MIB)
    progress.finish()
    drawn = out.getvalue()
    assert "verify" in drawn and "#" in drawn
    assert "300/400 MiB (75%), 100.0 MiB/s, ETA 1 s" in drawn
    assert re.search(r"\]\s+75%\s", drawn)  # click's own bar and percent
    last = drawn.rsplit("\r", 1)[-1]  # the last frame drawn: 100 % of what was counted
    assert re.search(r"\]\s+100%\s.*300/300 MiB \(100%\), 100.0 MiB/s", last)
    assert "in 3 s" not in drawn  # no plain lines on a terminal


def test_a_terminal_is_not_redrawn_for_every_small_read():
    out, clock = Terminal(), Clock()
    progress = ByteProgress(stream=out, clock=clock)
    progress.start("verify", 2000 * 10240)
    for _ in range(2000):
        progress.advance(10240)  # tarfile's reads: no time passes between them
    drawn_before_finish = out.getvalue().count("\r")
    progress.finish()
    assert drawn_before_finish <= 2


def test_a_small_phase_shows_nothing_and_one_that_grows_big_shows_from_then_on():
    out, clock = io.StringIO(), Clock()
    progress = ByteProgress(stream=out, tty=False, clock=clock)
    progress.start("verify", 2 * MIB)  # a refused small bundle keeps its error to one line
    progress.advance(2 * MIB)
    progress.finish()
    assert out.getvalue() == ""
    progress.start("save", 1 * MIB)  # an estimate far too low
    clock.now += 1
    progress.advance(20 * MIB)
    progress.finish()
    # The 20 MiB came in one chunk: shown, but no rate (nothing flowed after it).
    assert out.getvalue().splitlines() == ["save: 20/20 MiB (100%)",
                                           "save: 20/20 MiB (100%) in 1 s"]


def test_a_big_phase_shows_nothing_before_it_has_counted_min_bytes():
    for tty in (False, True):
        out, clock = (Terminal() if tty else io.StringIO()), Clock()
        progress = ByteProgress(stream=out, tty=tty, clock=clock)
        progress.start("verify", 544 * MIB)
        clock.now += 30
        progress.advance(10240)  # one tar header block: the work has not really started
        assert out.getvalue() == "", tty
        progress.advance(16 * MIB)
        assert "verify" in out.getvalue(), tty


def test_a_header_refusal_of_a_big_archive_is_one_line_without_progress(tmp_path):
    # The member with '..' is refused from its header, before its 20 MiB are read.
    archive = tmp_path / "bundle.tar"
    data = tmp_path / "zeros"
    with data.open("wb") as handle:
        handle.truncate(20 * MIB)
    with tarfile.open(archive, "w") as tar:
        tar.add(data, arcname="b/../images.tar.zst")
    assert archive.stat().st_size > 20 * MIB
    done = CliRunner().invoke(cli, ["bundle", "verify", str(archive), "--insecure-unsigned"])
    assert done.exit_code == 7
    (line,) = done.output.strip().splitlines()
    assert "climbs out with '..'" in line and "MiB" not in line
