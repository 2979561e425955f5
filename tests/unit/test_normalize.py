"""Layer and config normalisation on small synthetic layers (no Docker)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable
from pathlib import Path

import pytest
from tests.fake_engine import FakeEngine, archive_members

from stackpin.engine import chunk_stream
from stackpin.engine.save_format import image_layout
from stackpin.errors import BuildError
from stackpin.normalize import (
    NormalizeRequest,
    is_timestamp_pyc,
    normalize_config,
    normalize_image,
    normalize_layer,
    order_key,
    source_date_epoch_of,
    sweep_stale,
    unpack_save,
    volatile_reason,
)

SDE = 1735689600
LATER = SDE + 86_400 * 300
EARLIER = SDE - 86_400
HASH_PYC = b"\xa7\r\r\n" + (1).to_bytes(4, "little") + b"\x11" * 8 + b"code"
STAMP_PYC = b"\xa7\r\r\n" + (0).to_bytes(4, "little") + b"\x22" * 8 + b"code"


def member(name: str, data: bytes | None = b"x", **fields: object) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.mtime = LATER
    info.uname = info.gname = "root"
    if data is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = len(data)
        info.mode = 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    if info.type != tarfile.REGTYPE:
        info.size = 0
    return info, data


def layer_tar(members: Iterable[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() and data is not None else None)
    return out.getvalue()


def normalise(raw: bytes) -> tuple[bytes, object]:
    out = io.BytesIO()
    stats = normalize_layer(io.BytesIO(raw), out, source_date_epoch=SDE)
    return out.getvalue(), stats


def read(raw: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        return tar.getmembers()


def content(raw: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        data = tar.extractfile(name)
        assert data is not None
        return data.read()


def sample_layer(order: list[int] | None = None, mtime: int = LATER) -> bytes:
    items = [
        member("opt", None),
        member("opt/stackpin", None),
        member("opt/stackpin/venv", None),
        member("opt/stackpin/venv/a-b.py", b"print(1)\n"),
        member("opt/stackpin/venv/a", None),
        member("opt/stackpin/venv/a/z.py", b"z = 1\n"),
        member("opt/stackpin/entrypoint.sh", b"#!/bin/sh\n", mode=0o755),
    ]
    for info, _ in items:
        info.mtime = mtime
    if order:
        items = [items[i] for i in order]
    return layer_tar(items)


# --- members ---------------------------------------------------------------------------


def test_members_come_out_in_walk_order_with_folders_first():
    out, _ = normalise(sample_layer(order=[6, 5, 4, 3, 2, 1, 0]))
    names = [m.name for m in read(out)]
    assert names == [
        "opt", "opt/stackpin", "opt/stackpin/entrypoint.sh", "opt/stackpin/venv",
        "opt/stackpin/venv/a", "opt/stackpin/venv/a/z.py", "opt/stackpin/venv/a-b.py",
    ]
    assert names == sorted(names, key=order_key)


def test_same_content_in_another_order_and_time_gives_the_same_bytes():
    first, stats_a = normalise(sample_layer(mtime=LATER))
    second, stats_b = normalise(sample_layer(order=[0, 1, 2, 6, 5, 4, 3], mtime=LATER + 999))
    assert first == second
    assert stats_a == stats_b


def test_a_normal_layer_gives_itself_back():
    once, stats = normalise(sample_layer(order=[3, 1, 0, 2, 5, 4, 6]))
    twice, again = normalise(once)
    assert twice == once
    assert again.diff_id == stats.diff_id == f"sha256:{hashlib.sha256(once).hexdigest()}"


def test_mtimes_are_clamped_and_older_ones_kept():
    raw = layer_tar([member("new.txt"), member("old.txt", mtime=EARLIER)])
    mtimes = {m.name: m.mtime for m in read(normalise(raw)[0])}
    assert mtimes == {"new.txt": SDE, "old.txt": EARLIER}


def test_owner_names_go_numeric_owners_that_a_file_needs_stay():
    raw = layer_tar([
        member("usr/bin/tool", b"elf", uid=0, gid=42, uname="root", gname="shadow", mode=0o2755),
        member("home/u/file", uid=1000, gid=1000, uname="u", gname="u"),
    ])
    found = {m.name: (m.uid, m.gid, m.uname, m.gname, m.mode) for m in read(normalise(raw)[0])}
    assert found == {"home/u/file": (1000, 1000, "", "", 0o644),
                     "usr/bin/tool": (0, 42, "", "", 0o2755)}


def test_pax_atime_ctime_are_stripped_and_xattrs_kept():
    info, data = member("usr/bin/ping", b"elf")
    info.pax_headers = {
        "atime": "1796011048.123", "ctime": "1796011048.5", "mtime": f"{LATER}.25",
        "SCHILY.xattr.security.capability": "\x01\x00\x00\x02",
    }
    out, _ = normalise(layer_tar([(info, data)]))
    (got,) = read(out)
    assert got.pax_headers == {"SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}
    assert got.mtime == SDE
    assert b"atime" not in out
    assert b"ctime" not in out


@pytest.mark.parametrize(
    ("name", "is_dir", "dropped"),
    [
        ("var/log/dpkg.log", False, True),
        ("var/log/apt/history.log", False, True),
        ("var/log/apt", True, False),
        ("var/cache/ldconfig/aux-cache", False, True),
        ("root/.cache/pip/http/ab/cd", False, True),
        ("home/u/.cache/pip/wheels/x.whl", False, True),
        ("var/lib/dpkg/status-old", False, True),
        ("var/lib/dpkg/status", False, False),
        ("var/log/.wh.dpkg.log", False, False),
        ("var/log/.wh..wh..opq", False, False),
        ("opt/stackpin/venv/lib/python3.11/site-packages/pip/_internal/cache.py", False, False),
        ("./var/log/alternatives.log", False, True),
    ],
)
def test_volatile_paths(name, is_dir, dropped):
    assert (volatile_reason(name, is_dir=is_dir) is not None) == dropped


def test_timestamp_pycs_go_hash_pycs_stay():
    assert is_timestamp_pyc("m/__pycache__/x.cpython-311.pyc", STAMP_PYC)
    assert not is_timestamp_pyc("m/__pycache__/x.cpython-311.pyc", HASH_PYC)
    assert not is_timestamp_pyc("m/x.py", STAMP_PYC)


def test_volatile_files_are_removed_and_reported():
    raw = layer_tar([
        member("var", None), member("var/log", None),
        member("var/log/dpkg.log", b"2026-11-30 04:09 install"),
        member("var/cache/ldconfig/aux-cache", b"\x01\x02"),
        member("root/.cache/pip/selfcheck.json", b"{}"),
        member("m/__pycache__/old.cpython-311.pyc", STAMP_PYC),
        member("m/__pycache__/new.cpython-311.pyc", HASH_PYC),
        member("m/x.py", b"x = 1\n"),
    ])
    out, stats = normalise(raw)
    assert [m.name for m in read(out)] == [
        "m/__pycache__/new.cpython-311.pyc", "m/x.py", "var", "var/log",
    ]
    assert stats.removed == (
        "m/__pycache__/old.cpython-311.pyc", "root/.cache/pip/selfcheck.json",
        "var/cache/ldconfig/aux-cache", "var/log/dpkg.log",
    )
    assert stats.members == 4


def test_whiteouts_survive():
    raw = layer_tar([
        member("etc/.wh.motd", b""),
        member("opt/old/.wh..wh..opq", b""),
        member("var/log/.wh.dpkg.log", b""),
        member("etc/hostname", b"x\n"),
    ])
    names = [m.name for m in read(normalise(raw)[0])]
    assert names == ["etc/.wh.motd", "etc/hostname", "opt/old/.wh..wh..opq",
                     "var/log/.wh.dpkg.log"]


def test_hard_links_stay_valid_when_sorting_puts_a_link_first(tmp_path: Path):
    target, data = member("z/lib.so", b"ELF-DATA")
    link, _ = member("a/lib-link.so", None, type=tarfile.LNKTYPE, linkname="z/lib.so")
    other, _ = member("m/other.so", None, type=tarfile.LNKTYPE, linkname="z/lib.so")
    out, _ = normalise(layer_tar([(target, data), (link, None), (other, None)]))
    got = {m.name: m for m in read(out)}
    assert got["a/lib-link.so"].isfile()
    assert got["a/lib-link.so"].size == len(b"ELF-DATA")
    assert got["m/other.so"].islnk() and got["m/other.so"].linkname == "a/lib-link.so"
    assert got["z/lib.so"].islnk() and got["z/lib.so"].linkname == "a/lib-link.so"
    with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as tar:
        if hasattr(tarfile, "tar_filter"):  # extraction filters: CPython 3.11.4 and later
            tar.extractall(tmp_path, filter="tar")
        else:  # Debian 12's 3.11.2 (command 1's venv on a fresh machine)
            tar.extractall(tmp_path)
    assert (tmp_path / "z/lib.so").read_bytes() == b"ELF-DATA"
    assert (tmp_path / "z/lib.so").stat().st_ino == (tmp_path / "a/lib-link.so").stat().st_ino


def test_symlinks_devices_and_gnu_input_are_rewritten_as_pax():
    raw = layer_tar([
        member("usr/lib/libz.so", None, type=tarfile.SYMTYPE, linkname="libz.so.1"),
        member("dev/null", None, type=tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666),
        member("a/" + "long" * 40 + ".py", b"x"),
    ], fmt=tarfile.GNU_FORMAT)
    out, _ = normalise(raw)
    got = {m.name: m for m in read(out)}
    assert got["usr/lib/libz.so"].issym() and got["usr/lib/libz.so"].linkname == "libz.so.1"
    assert (got["dev/null"].devmajor, got["dev/null"].devminor) == (1, 3)
    assert b"././@LongLink" not in out  # GNU long names became a PAX path record
    assert content(out, "a/" + "long" * 40 + ".py") == b"x"


def test_an_unreadable_layer_is_a_build_error():
    with pytest.raises(BuildError, match="cannot read a layer tar"):
        normalise(b"not a tar at all" * 64)


# --- config ----------------------------------------------------------------------------


def raw_config(created: str, container: str, parent: str) -> dict[str, object]:
    """What Docker 20.10's classic builder writes (abridged)."""
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "container": container,
        "docker_version": "20.10.24+dfsg1",
        "container_config": {"Hostname": container[:12], "Cmd": ["/bin/sh", "-c", "#(nop) "]},
        "config": {"Hostname": "", "Image": parent, "Env": ["PATH=/usr/bin"],
                   "Labels": {"io.stackpin.source-date-epoch": str(SDE)}},
        "history": [
            {"created": "2025-01-01T00:00:00Z", "created_by": "stackpin bootstrap"},
            {"created": created, "created_by": "/bin/sh -c #(nop) COPY dir:abc in /opt"},
            {"created": created, "created_by": "/bin/sh -c #(nop)  ENV A=1", "empty_layer": True},
        ],
        "rootfs": {"type": "layers", "diff_ids": ["sha256:old1", "sha256:old2"]},
    }


def test_config_fields_of_the_build_run_are_fixed():
    out = json.loads(normalize_config(
        raw_config("2026-11-30T04:09:58.71Z", "4c846f51" * 8, "sha256:49cb"),
        diff_ids=["sha256:new1", "sha256:new2"], source_date_epoch=SDE,
    ))
    assert out["created"] == "2025-01-01T00:00:00Z"
    assert {h["created"] for h in out["history"]} == {"2025-01-01T00:00:00Z"}
    assert "container" not in out and "container_config" not in out
    assert "docker_version" not in out
    assert out["config"]["Image"] == ""
    assert out["config"]["Env"] == ["PATH=/usr/bin"]
    assert out["rootfs"] == {"type": "layers", "diff_ids": ["sha256:new1", "sha256:new2"]}
    assert out["history"][2]["empty_layer"] is True


def test_two_runs_of_the_same_build_give_the_same_config_bytes():
    a = normalize_config(raw_config("2026-11-30T04:09:58Z", "aa" * 32, "sha256:1"),
                         diff_ids=["sha256:n"], source_date_epoch=SDE)
    b = normalize_config(raw_config("2026-12-01T11:00:00Z", "bb" * 32, "sha256:2"),
                         diff_ids=["sha256:n"], source_date_epoch=SDE)
    assert a == b


def test_the_epoch_comes_from_the_label():
    assert source_date_epoch_of(raw_config("x", "c", "p")["config"]["Labels"], "img") == SDE
    with pytest.raises(BuildError, match=r"no io\.stackpin\.source-date-epoch label"):
        source_date_epoch_of({}, "img")


# --- the whole image, through a fake engine ------------------------------------------


# Engine 20.10, Engine 25+ on the classic store and on the containerd image store.
ENGINE_KINDS = ["docker20", "classic", "containerd"]


def built_image(engine: FakeEngine, *, container: str, mtime: int) -> tuple[str, bytes]:
    base = layer_tar([member("etc", None, mtime=LATER), member("etc/os-release", b"debian",
                                                                mtime=LATER)])
    install = sample_layer(mtime=mtime)
    verify = layer_tar([member("opt/stackpin/verify/x.py", b"v", mtime=mtime),
                        member("var/log/build.log", b"noise", mtime=mtime)])
    image = engine.add(raw_config(f"2026-11-30T04:{mtime % 60:02d}:00Z", container, "sha256:p"),
                       [base, install, verify, install])
    return image, base


def base_diff(base: bytes) -> frozenset[str]:
    return frozenset({f"sha256:{hashlib.sha256(base).hexdigest()}"})


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_two_builds_normalise_to_one_image_id(tmp_path: Path, kind: str):
    engine = FakeEngine(kind=kind)
    first, base = built_image(engine, container="a" * 64, mtime=LATER)
    second, _ = built_image(engine, container="b" * 64, mtime=LATER + 77)
    assert first != second
    results = [
        normalize_image(engine, NormalizeRequest(image=raw, tags=(f"stackpin/c:{n}",),
                                                 keep_diff_ids=base_diff(base),
                                                 work_dir=tmp_path / "work"))
        for n, raw in (("one", first), ("two", second))
    ]
    assert results[0].image_id == results[1].image_id
    assert engine.tags == {"stackpin/c:one": results[0].image_id,
                           "stackpin/c:two": results[0].image_id}
    assert len(engine.loaded) == 1  # the second found the image already there
    assert list((tmp_path / "work").iterdir()) == []  # temp folders removed


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_base_layers_pass_through_and_duplicates_stay_shared(tmp_path: Path, kind: str):
    engine = FakeEngine(kind=kind)
    raw, base = built_image(engine, container="c" * 64, mtime=LATER)
    result = normalize_image(engine, NormalizeRequest(
        image=raw, tags=("t:1",), keep_diff_ids=base_diff(base), work_dir=tmp_path))
    actions = [o.action for o in result.layers]
    assert actions == ["kept", "rewritten", "rewritten", "rewritten"]
    assert result.layers[0].diff_id == f"sha256:{hashlib.sha256(base).hexdigest()}"
    assert result.layers[1].diff_id == result.layers[3].diff_id
    assert result.layers[2].removed == ("var/log/build.log",)
    stored = engine.images[result.image_id]
    config, layers = stored.config, stored.layers
    assert layers[0] == base
    assert json.loads(config)["created"] == "2025-01-01T00:00:00Z"


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_normalising_a_normal_image_changes_nothing(tmp_path: Path, kind: str):
    engine = FakeEngine(kind=kind)
    raw, base = built_image(engine, container="d" * 64, mtime=LATER)
    req = NormalizeRequest(image=raw, tags=("t:1",), keep_diff_ids=base_diff(base), work_dir=tmp_path)
    first = normalize_image(engine, req)
    again = normalize_image(engine, NormalizeRequest(image=first.image_id, tags=("t:1",),
                                                     keep_diff_ids=base_diff(base), work_dir=tmp_path))
    assert again.image_id == first.image_id
    assert {o.action for o in again.layers} == {"kept", "unchanged"}


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_layers_that_came_out_as_they_went_in_are_not_sent_back(tmp_path: Path, kind: str):
    # An image whose layers are already normal and whose config alone moves.
    # The classic store's load never reads a layer whose chain it holds, so those stay
    # home; the containerd store wants every blob it lacks by digest, so all travel.
    engine = FakeEngine(kind=kind)
    raw, base = built_image(engine, container="9" * 64, mtime=LATER)
    first = normalize_image(engine, NormalizeRequest(
        image=raw, tags=("t:1",), keep_diff_ids=base_diff(base), work_dir=tmp_path))
    normal_layers = engine.images[first.image_id].layers
    config = raw_config("2026-12-05T12:00:00Z", "8" * 64, "sha256:p")
    config["config"]["Labels"]["io.stackpin.note"] = "another image"  # type: ignore[index]
    clamped = engine.add(config, list(normal_layers))
    engine.layers_not_sent.clear()
    second = normalize_image(engine, NormalizeRequest(
        image=clamped, tags=("t:2",), keep_diff_ids=base_diff(base), work_dir=tmp_path))
    assert second.image_id != first.image_id
    assert {o.action for o in second.layers} == {"kept", "unchanged"}
    assert engine.images[second.image_id].layers == normal_layers
    held = len(engine.layers_not_sent)
    assert held == (0 if kind == "containerd" else len(normal_layers))
    sent = archive_members(engine.loaded[-1])
    assert sum(name.startswith("blobs/") for name in sent) == 2 + (
        3 if kind == "containerd" else 0)  # config, manifest (+ the three distinct layers)


def test_a_layer_below_a_rewritten_one_is_held_but_the_rest_travel(tmp_path: Path):
    engine = FakeEngine(kind="classic")
    raw, base = built_image(engine, container="7" * 64, mtime=LATER)
    normalize_image(engine, NormalizeRequest(image=raw, tags=("t:1",),
                                             keep_diff_ids=base_diff(base), work_dir=tmp_path))
    assert len(engine.layers_not_sent) == 1  # the base; everything above it was rewritten
    assert engine.layers_not_sent[0] == f"sha256:{hashlib.sha256(base).hexdigest()}"


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_a_warm_rebuild_reuses_the_cached_result_without_saving(tmp_path: Path, kind: str):
    engine = FakeEngine(kind=kind)
    raw, base = built_image(engine, container="e" * 64, mtime=LATER)
    req = NormalizeRequest(image=raw, tags=("t:1",), keep_diff_ids=base_diff(base),
                           work_dir=tmp_path / "w", cache_dir=tmp_path / "cache")
    first = normalize_image(engine, req)
    engine.tags.clear()
    second = normalize_image(engine, req)
    assert second.reused and second.image_id == first.image_id
    assert len(engine.saved) == 1
    assert engine.tags == {"t:1": first.image_id}


def test_an_image_without_the_epoch_label_is_refused(tmp_path: Path):
    engine = FakeEngine()
    config = raw_config("2026", "f" * 64, "p")
    config["config"] = {"Labels": {}}
    raw = engine.add(config, [layer_tar([member("a")])])
    with pytest.raises(BuildError, match="--no-normalize"):
        normalize_image(engine, NormalizeRequest(image=raw, tags=(), work_dir=tmp_path))


def test_archive_round_trips_through_unpack(tmp_path: Path):
    layer = tmp_path / "l.tar"
    layer.write_bytes(sample_layer())
    diff_id = f"sha256:{hashlib.sha256(layer.read_bytes()).hexdigest()}"
    config = normalize_config(raw_config("x", "c", "p"), diff_ids=[diff_id, diff_id],
                              source_date_epoch=SDE)
    stream = chunk_stream(image_layout(config, [(diff_id, layer), (diff_id, layer)]).chunks)
    (tmp_path / "u").mkdir()
    saved = unpack_save(stream, tmp_path / "u")
    assert saved.config == json.loads(config)
    assert [saved.layer_digests[p] for p in saved.layers] == [diff_id, diff_id]


def test_temp_folders_of_dead_runs_are_swept(tmp_path: Path):
    import os

    gone = tmp_path / f"normalize-{2**22 + 12345}-abc"  # above Linux's highest pid_max
    mine = tmp_path / f"normalize-{os.getpid()}-def"
    other = tmp_path / "keep-me"
    for folder in (gone, mine, other):
        folder.mkdir()
        (folder / "in-0.tar").write_bytes(b"x")
    sweep_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name])
