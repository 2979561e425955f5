"""Normalisation of the config alone, where BuildKit's steps made the layers reproducible
(stackpin.normalize_record), through the fake engine (no Docker)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from tests.fake_engine import ZERO_SETTINGS, FakeEngine, archive_members

from stackpin.engine.types import HistoryItem, ImageRecord
from stackpin.normalize import NormalizeRequest, normalize_image
from stackpin.normalize_record import config_from_record, set_settings

SDE = 1700000000


def layer(name: str, data: bytes) -> bytes:
    """An uncompressed layer tar of one file at the epoch (as the clamped steps write)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mtime = len(data), SDE
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


BASE = layer("etc/os-release", b"debian")
STUBS = layer("etc/hosts", b"127.0.0.1\tlocalhost\n")
RUN = layer("opt/stackpin/venv/x.py", b"x = 1\n")


def buildkit_config(created: str, *, note: str = "") -> dict[str, object]:
    """What Engine 20.10's BuildKit writes (abridged): the build's time in created and in
    every step it ran."""
    labels = {"io.stackpin.source-date-epoch": str(SDE), **({"note": note} if note else {})}
    step = {"created": created, "comment": "buildkit.dockerfile.v0"}
    return {
        "architecture": "amd64", "os": "linux", "created": created,
        "config": {"Env": ["PATH=/usr/bin"], "Labels": labels, "WorkingDir": "/",
                   "Entrypoint": ["/opt/stackpin/entrypoint.sh"], "ArgsEscaped": True},
        "history": [
            {"created": "2025-01-01T00:00:00Z", "created_by": "stackpin bootstrap"},
            {**step, "created_by": "ADD mount-stubs.tar / # buildkit"},
            {**step, "created_by": "ARG SOURCE_DATE_EPOCH=1700000000", "empty_layer": True},
            {**step, "created_by": "RUN /bin/bash -c uv pip install"},
        ],
    }


def build(engine: FakeEngine, created: str, *, run: bytes = RUN, note: str = "") -> str:
    return engine.add(buildkit_config(created, note=note), [BASE, STUBS, run])


def request(raw: str, tmp_path: Path, tag: str = "t:1") -> NormalizeRequest:
    return NormalizeRequest(image=raw, tags=(tag,), work_dir=tmp_path / "work",
                            layers_as_built=True)


def test_two_buildkit_builds_give_one_id_and_no_layer_travels(tmp_path: Path):
    engine = FakeEngine(kind="docker20")
    first = build(engine, "2026-12-05T10:00:00Z")
    second = build(engine, "2026-12-05T11:30:00Z")
    assert first != second
    one = normalize_image(engine, request(first, tmp_path))
    two = normalize_image(engine, request(second, tmp_path, "t:2"))
    assert one.image_id == two.image_id
    assert {o.action for o in one.layers} == {"as built"}
    assert engine.images[one.image_id].layers == [BASE, STUBS, RUN]
    sent = archive_members(engine.loaded[0])
    assert sorted(sent) == [f"blobs/sha256/{one.image_id[7:]}", "manifest.json"]
    assert len(engine.layers_not_sent) == 3
    assert len(engine.loaded) == 1  # the second found the normal image there already
    config = json.loads(engine.images[one.image_id].config)
    assert config["created"] == "2023-11-14T22:13:20Z"
    assert {h["created"] for h in config["history"]} == {"2023-11-14T22:13:20Z"}
    assert [h.get("empty_layer", False) for h in config["history"]] == [False, False, True, False]
    assert config["config"]["Labels"]["io.stackpin.source-date-epoch"] == str(SDE)


def test_a_layer_that_differs_still_gives_another_id(tmp_path: Path):
    # The config rewrite cannot hide a step whose files came out different: the layers
    # are named in the config as built.
    engine = FakeEngine(kind="docker20")
    first = build(engine, "2026-12-05T10:00:00Z")
    other = build(engine, "2026-12-05T10:00:00Z", run=layer("opt/stackpin/venv/x.py", b"x = 2\n"))
    one = normalize_image(engine, request(first, tmp_path))
    two = normalize_image(engine, request(other, tmp_path, "t:2"))
    assert one.image_id != two.image_id


def test_a_settings_change_gives_another_id(tmp_path: Path):
    engine = FakeEngine(kind="docker20")
    one = normalize_image(engine, request(build(engine, "2026-12-05T10:00:00Z"), tmp_path))
    two = normalize_image(engine, request(build(engine, "2026-12-05T10:00:00Z", note="x"),
                                          tmp_path, "t:2"))
    assert one.image_id != two.image_id


def test_the_containerd_store_gets_the_full_rewrite(tmp_path: Path):
    engine = FakeEngine(kind="containerd")
    result = normalize_image(engine, request(build(engine, "2026-12-05T10:00:00Z"), tmp_path))
    assert "as built" not in {o.action for o in result.layers}


def test_a_history_that_cannot_place_the_layers_gets_the_full_rewrite(tmp_path: Path):
    engine = FakeEngine(kind="docker20")
    config = buildkit_config("2026-12-05T10:00:00Z")
    config["history"][1]["empty_layer"] = True  # type: ignore[index]
    raw = engine.add(config, [BASE, STUBS, RUN])
    lines: list[str] = []
    result = normalize_image(engine, request(raw, tmp_path), on_line=lines.append)
    assert "as built" not in {o.action for o in result.layers}
    assert any("does not say which steps made the layers" in line for line in lines)


def record(*sizes: int, settings: dict[str, object] | None = None) -> ImageRecord:
    return ImageRecord(
        settings={**ZERO_SETTINGS, **(settings or {})}, architecture="amd64", os="linux",
        variant="", author="", diff_ids=tuple(f"sha256:{n}" for n, s in enumerate(sizes) if s),
        history=tuple(HistoryItem(created_by=f"step {n}", comment="", size=s)
                      for n, s in enumerate(sizes)),
    )


def test_a_zero_size_layer_step_is_ambiguous():
    rec = record(10, 0, 5)
    assert config_from_record(rec, source_date_epoch=SDE) is not None
    ambiguous = ImageRecord(**{**rec.__dict__, "diff_ids": ("sha256:a", "sha256:b", "sha256:c")})
    assert config_from_record(ambiguous, source_date_epoch=SDE) is None


def test_only_settings_that_are_set_are_kept_and_run_fields_never():
    kept = set_settings({**ZERO_SETTINGS, "Env": ["A=1"], "Hostname": "4c846f51",
                         "Image": "sha256:prev", "ArgsEscaped": True, "Shell": []})
    assert kept == {"Env": ["A=1"], "ArgsEscaped": True}


@pytest.mark.parametrize("order", [1, -1])
def test_the_config_bytes_do_not_depend_on_the_daemon_s_field_order(order: int):
    settings = {"Env": ["A=1"], "Labels": {"b": "2", "a": "1"}, "WorkingDir": "/"}
    shuffled = dict(list(settings.items())[::order])
    assert (config_from_record(record(3, settings=shuffled), source_date_epoch=SDE)
            == config_from_record(record(3, settings=settings), source_date_epoch=SDE))
