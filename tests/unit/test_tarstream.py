"""The tar stream reader against tarfile, on the member kinds docker saves and layers hold,
and on streams damaged where tarfile would stop without a word."""

from __future__ import annotations

import io
import tarfile

import pytest

from stackpin.bundle.verify import BoundedTarInfo
from stackpin.primitives import CHUNK
from stackpin.tarstream import read_tar_stream


def _tar(fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        def add(name: str, data: bytes | None = None, **fields: object) -> None:
            info = tarfile.TarInfo(name)
            for key, value in fields.items():
                setattr(info, key, value)
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        add("blobs/", type=tarfile.DIRTYPE, mode=0o755)
        add("blobs/sha256/" + "a" * 64, bytes(range(256)) * (CHUNK // 128 + 3))
        add("empty", b"")
        add("odd", b"x" * 513)
        add("d/" + "long-name-" * 20, b"long")  # pax path (GNU: a longname member)
        add("link", type=tarfile.SYMTYPE, linkname="../" + "t" * 120)
        add("hard", type=tarfile.LNKTYPE, linkname="odd")
        add("manifest.json", b"[]")
    return buffer.getvalue()


def _by_tarfile(data: bytes) -> list[tuple[str, str, int, str, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        return [(m.name, m.type.decode(), m.size, m.linkname,
                 tar.extractfile(m).read() if m.isfile() else None)  # type: ignore[union-attr]
                for m in tar]


def _by_stream(data: bytes, *, read: bool = True) -> list[tuple[str, str, int, str, bytes | None]]:
    with read_tar_stream(io.BufferedReader(io.BytesIO(data))) as tar:
        return [(m.name, m.type.decode(), m.size, m.linkname,
                 tar.extractfile(m).read() if m.isfile() and read else None)
                for m in tar]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_members_and_bodies_are_tarfiles(fmt):
    data = _tar(fmt)
    assert _by_stream(data) == _by_tarfile(data)
    assert len(_by_stream(data)) == 8


def test_bodies_left_unread_are_skipped():
    data = _tar()
    names = [m[0] for m in _by_stream(data, read=False)]
    assert names == [m[0] for m in _by_tarfile(data)]


def test_a_body_read_in_part_then_the_next_member():
    data = _tar()
    with read_tar_stream(io.BytesIO(data)) as tar:
        seen = []
        for member in tar:
            if member.isfile():
                seen.append(tar.extractfile(member).read(7))
    assert seen[0] == bytes(range(7)) and seen[-1] == b"[]"


def test_a_source_without_readinto():
    class ReadOnly:
        def __init__(self, data: bytes) -> None:
            self._inner = io.BytesIO(data)

        def read(self, size: int = -1) -> bytes:
            return self._inner.read(min(size, 1000) if size > 0 else size)

    data = _tar()
    with read_tar_stream(ReadOnly(data)) as tar:  # type: ignore[arg-type]
        bodies = [tar.extractfile(m).read() for m in tar if m.isfile()]
    assert bodies == [m[4] for m in _by_tarfile(data) if m[4] is not None]


def test_a_stream_cut_inside_a_body():
    data = _tar()
    with pytest.raises(tarfile.ReadError, match="unexpected end of data"):
        _by_stream(data[:CHUNK])


def test_a_stream_cut_at_a_header_boundary():
    data = _tar()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        end = max(m.offset_data + -(-m.size // 512) * 512 for m in tar)
    # tarfile ends such a stream quietly; the missing end block says it was cut
    assert [m[0] for m in _by_tarfile(data[:end])] == [m[0] for m in _by_tarfile(data)]
    with pytest.raises(tarfile.ReadError, match="without its end block"):
        _by_stream(data[:end])


def test_an_empty_stream():
    with pytest.raises(tarfile.ReadError, match="is empty"):
        _by_stream(b"")


def test_a_damaged_header_midway():
    data = bytearray(_tar())
    with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r|") as tar:
        odd = next(m for m in tar if m.name == "odd")
    data[odd.offset + 148:odd.offset + 156] = b"0000000\0"  # its checksum
    # tarfile stops at the damaged header as if the archive ended there
    assert "manifest.json" not in [m[0] for m in _by_tarfile(bytes(data))]
    with pytest.raises(tarfile.ReadError, match=f"bad tar header at byte {odd.offset}"):
        _by_stream(bytes(data))


def test_a_member_asked_for_out_of_turn():
    with read_tar_stream(io.BytesIO(_tar())) as tar:
        members = iter(tar)
        first_file = next(m for m in members if m.isfile())
        next(members)
        with pytest.raises(tarfile.ReadError, match="not the current member"):
            tar.extractfile(first_file)


def test_the_callers_tarinfo_caps_extended_headers():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("x")
        info.pax_headers = {"comment": "c" * (1 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(tarfile.ReadError, match="an extended header"), \
            read_tar_stream(io.BytesIO(buffer.getvalue()), tarinfo=BoundedTarInfo) as tar:
        list(tar)


def test_a_negative_size_is_refused():
    data = bytearray(_tar())
    with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r|") as tar:
        odd = next(m for m in tar if m.name == "odd")
    header = bytearray(data[odd.offset:odd.offset + 512])
    header[124:136] = b"\xff" * 12  # base-256: -1
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[odd.offset:odd.offset + 512] = header
    with pytest.raises(tarfile.ReadError, match="negative size"):
        _by_stream(bytes(data))
