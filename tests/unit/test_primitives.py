"""The shared primitives: stream hashing, the tar member writer, staging then swapping."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from stackpin.primitives import (
    CHUNK,
    HashingReader,
    HashingWriter,
    ReadAhead,
    hash_stream,
    sha256_file,
    staged_folder,
    tar_directory,
    tar_end,
    tar_member,
    written_back,
)

DATA = os.urandom(2 * CHUNK + 123)  # more than one read, and not a whole number of them


def test_hash_stream_and_file_hash_everything_left(tmp_path: Path):
    path = tmp_path / "blob"
    path.write_bytes(DATA)
    assert hash_stream(io.BytesIO(DATA)) == (len(DATA), hashlib.sha256(DATA).hexdigest())
    assert sha256_file(path) == hashlib.sha256(DATA).hexdigest()
    handle = io.BytesIO(DATA)
    handle.read(100)
    assert hash_stream(handle) == (len(DATA) - 100, hashlib.sha256(DATA[100:]).hexdigest())


def test_hashing_writer_and_reader_pass_the_bytes_through_unchanged():
    out = io.BytesIO()
    writer = HashingWriter(out)
    for start in range(0, len(DATA), 70000):
        writer.write(DATA[start:start + 70000])
    assert out.getvalue() == DATA and writer.size == len(DATA) == writer.tell()
    assert writer.sha256.hexdigest() == hashlib.sha256(DATA).hexdigest()

    reader = HashingReader(io.BytesIO(DATA))
    assert reader.read() == DATA
    assert reader.size == len(DATA)
    assert reader.sha256.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_tar_members_read_back_with_their_modes_times_and_bytes():
    stream = io.BytesIO()
    stream.write(tar_directory("top", mtime=7, fmt=tarfile.PAX_FORMAT))
    long_name = "top/" + "d" * 120 + "/run.sh"  # longer than a ustar name: PAX carries it
    for chunk in tar_member(long_name, io.BytesIO(DATA), len(DATA), mtime=7, mode=0o755,
                            fmt=tarfile.PAX_FORMAT):
        stream.write(chunk)
    stream.write(tar_end(stream.tell()))
    assert stream.tell() % tarfile.RECORDSIZE == 0
    stream.seek(0)
    with tarfile.open(fileobj=stream) as tar:
        top, member = tar.getmembers()
        assert top.isdir() and top.mode == 0o755 and top.mtime == 7
        assert member.name == long_name and member.mode == 0o755 and member.mtime == 7
        assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "", "")
        extracted = tar.extractfile(member)
        assert extracted is not None and extracted.read() == DATA


def test_tar_end_without_an_offset_is_the_two_zero_blocks():
    assert tar_end() == b"\0" * 1024
    assert len(tar_end(512)) == tarfile.RECORDSIZE - 512


def test_a_staged_folder_replaces_the_target_only_on_success(tmp_path: Path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    def fail_half_way() -> None:
        with staged_folder(target) as staging:
            (staging / "new.txt").write_text("new")
            msg = "half-way"
            raise RuntimeError(msg)

    with pytest.raises(RuntimeError):
        fail_half_way()
    assert [p.name for p in tmp_path.iterdir()] == ["out"], "no staging folder is left"
    assert [p.name for p in target.iterdir()] == ["old.txt"], "the target is untouched"

    with staged_folder(target) as staging:
        (staging / "new.txt").write_text("new")
        assert not (target / "new.txt").exists(), "nothing shows before the swap"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in target.iterdir()] == ["new.txt"]


def test_a_staged_folder_clears_what_dead_runs_left_but_not_live_ones(tmp_path: Path):
    dead = tmp_path / ".out.partial-999999999"
    live = tmp_path / f".out.old-{os.getppid()}"
    other = tmp_path / ".another.partial-999999999"
    for folder in (dead, live, other):
        folder.mkdir()
    with staged_folder(tmp_path / "out"):
        pass
    assert not dead.exists()
    assert live.exists() and other.exists()


# --- ReadAhead ------------------------------------------------------------------------------


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "read-ahead"]


def test_read_ahead_gives_every_chunk_in_order():
    chunks = [bytes([i]) * (i + 1) for i in range(50)]  # many more than its depth
    assert list(ReadAhead(iter(chunks), depth=3)) == chunks
    assert _workers() == []


def test_an_error_of_the_source_comes_after_the_chunks_before_it():
    failure = ValueError("changed while it was being loaded")

    def source():
        yield b"a"
        yield b"b"
        raise failure

    ahead = ReadAhead(source(), depth=4)
    assert [next(ahead), next(ahead)] == [b"a", b"b"]
    with pytest.raises(ValueError, match="being loaded") as caught:
        next(ahead)
    assert caught.value is failure
    assert _workers() == []


def test_the_worker_runs_at_most_depth_chunks_ahead():
    depth, asked = 4, []
    limit_reached = threading.Event()

    def source():
        for i in range(1000):
            asked.append(i)
            if i == depth + 1:  # one taken, depth waiting, one in the worker's hand
                limit_reached.set()
            yield b"x"

    ahead = ReadAhead(source(), depth=depth)
    next(ahead)
    assert limit_reached.wait(10)
    time.sleep(0.3)  # an unbounded worker would run on through the 1000 meanwhile
    assert len(asked) == depth + 2
    ahead.close()


def test_closing_early_stops_the_worker_and_closes_the_source():
    closed = threading.Event()

    def source():
        try:
            while True:
                yield b"x" * CHUNK
        finally:
            closed.set()

    ahead = ReadAhead(source(), depth=2)
    next(ahead)
    ahead.close()
    assert closed.is_set()  # the source's own cleanup ran (its file is released)
    assert _workers() == []


def test_the_worker_asks_for_the_first_chunk_before_anyone_reads():
    # A save request goes out at once: the export writes its kept frames meanwhile.
    asked = threading.Event()

    def source():
        asked.set()
        yield b"x"

    ahead = ReadAhead(source(), depth=2)
    assert asked.wait(30)
    ahead.close()  # never read: closing still stops the worker
    assert _workers() == []


def test_written_back_syncs_the_file_while_it_is_written_and_stops_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    synced: list[int] = []
    twice = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        synced.append(fd)
        if len(synced) >= 2:
            twice.set()

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with (tmp_path / "f").open("wb") as out:
        with written_back(out.fileno(), every_s=0.01):
            out.write(b"x" * 4096)
            out.flush()
            assert twice.wait(60), "no fdatasync while the file was written"
            assert set(synced) == {out.fileno()}
        after = len(synced)
        time.sleep(0.05)
        assert len(synced) == after  # the worker is gone once the block ends
    assert not [t for t in threading.enumerate() if t.name == "write-back"]
