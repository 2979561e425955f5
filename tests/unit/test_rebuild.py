"""The rebuild check's comparison and its flow, on synthetic images (no Docker)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL
from tests.fake_engine import FakeEngine
from tests.unit.test_normalize import ENGINE_KINDS, LATER, SDE, layer_tar, member, raw_config

import stackpin.rebuild as rebuild_module
from stackpin.build import plan, sha256_text
from stackpin.engine import BuildRequest
from stackpin.engine.builders import BuilderChoice
from stackpin.errors import BuildError, HostEnvironmentError
from stackpin.lock import read_lock
from stackpin.normalize import NormalizeRequest, normalize_image
from stackpin.rebuild import (
    ImageSnapshot,
    MemberSummary,
    check_rebuild,
    diff_configs,
    diff_images,
    diff_members,
    differing_paths,
    flatten,
    report_lines,
    snapshot_images,
    summarize_layer,
)
from stackpin.target import LABEL_DOCKERFILE_SHA256, Layout, Target


def summary(**fields: object) -> MemberSummary:
    base = {"type": "file", "mode": 0o644, "uid": 0, "gid": 0, "owner_names": ":",
            "mtime": SDE, "size": 1, "sha256": "aa", "linkname": ""}
    base.update(fields)
    return MemberSummary(**base)  # type: ignore[arg-type]


# --- pure comparison -------------------------------------------------------------------


def test_each_kind_of_difference_is_named():
    existing = {
        "same": summary(),
        "content": summary(sha256="aa"),
        "mtime": summary(),
        "mode": summary(),
        "owner": summary(),
        "gone": summary(),
        "several": summary(),
    }
    rebuilt = {
        "same": summary(),
        "content": summary(sha256="bb"),
        "mtime": summary(mtime=SDE + 5),
        "mode": summary(mode=0o755),
        "owner": summary(uid=1000, gid=1000, owner_names="u:u"),
        "new": summary(),
        "several": summary(size=9, sha256="cc", mtime=LATER, mode=0o600),
    }
    found = {d.path: d.kinds for d in diff_members(existing, rebuilt)}
    assert found == {
        "content": ("content",),
        "gone": ("only_in_existing",),
        "mode": ("mode",),
        "mtime": ("mtime",),
        "new": ("only_in_rebuilt",),
        "owner": ("owner",),
        "several": ("content", "mtime", "mode"),
    }


def test_a_changed_symlink_target_is_a_content_difference():
    a = {"lib.so": summary(type="symlink", size=0, sha256="", linkname="lib.so.1")}
    b = {"lib.so": summary(type="symlink", size=0, sha256="", linkname="lib.so.2")}
    assert diff_members(a, b)[0].kinds == ("content",)


def test_config_differences_are_dotted_paths():
    a = {"config": {"Labels": {"io.stackpin.source-commit": "abc", "x": "1"}, "Env": ["A=1"]},
         "history": [{"created_by": "COPY a"}], "rootfs": {"diff_ids": ["sha256:1"]}}
    b = {"config": {"Labels": {"io.stackpin.source-commit": "def", "x": "1"}, "Env": ["A=2"]},
         "history": [{"created_by": "COPY a"}], "rootfs": {"diff_ids": ["sha256:2"]}}
    diffs = {d.field: (d.existing, d.rebuilt) for d in diff_configs(a, b)}
    assert diffs == {"config.Env[0]": ("A=1", "A=2"),
                     "config.Labels.io.stackpin.source-commit": ("abc", "def")}
    assert flatten({"a": [], "b": {}}) == {"a": [], "b": {}}


def snapshot(image_id: str, layers: dict[str, dict[str, MemberSummary]],
             commands: list[str]) -> ImageSnapshot:
    config = {"history": [{"created_by": c} for c in commands] + [
        {"created_by": "ENV A=1", "empty_layer": True}],
        "rootfs": {"diff_ids": list(layers)}}
    return ImageSnapshot(image_id=image_id, config=config, layers=layers)


def test_images_are_compared_layer_by_layer():
    base = {"etc/os-release": summary()}
    existing = snapshot("sha256:e", {"sha256:base": base, "sha256:l2": {"opt/x": summary()}},
                        ["bootstrap", "COPY x"])
    rebuilt = snapshot("sha256:r", {"sha256:base": base,
                                    "sha256:l2b": {"opt/x": summary(sha256="ff")},
                                    "sha256:l3": {"opt/y": summary()}},
                       ["bootstrap", "COPY x", "RUN date > /opt/y"])
    report = diff_images("stackpin/c:stable", existing, rebuilt)
    assert not report.identical
    assert [(layer.index, layer.existing, layer.rebuilt) for layer in report.layers] == [
        (2, "sha256:l2", "sha256:l2b"), (3, None, "sha256:l3")]
    assert report.layers[1].created_by == "RUN date > /opt/y"
    assert differing_paths(report) == ["/opt/x", "/opt/y"]
    data = report.to_json()
    assert data["pass"] is False
    assert data["layers"][1]["paths"][0] == {
        "path": "opt/y", "kinds": ["only_in_rebuilt"], "existing": None,
        "rebuilt": summary().to_json()}
    assert json.loads(json.dumps(data)) == data


def test_text_report_names_layers_paths_and_kinds():
    existing = snapshot("sha256:e", {"sha256:l1": {f"f{i:02d}": summary() for i in range(25)}},
                        ["COPY many"])
    rebuilt = snapshot("sha256:r", {"sha256:l2": {f"f{i:02d}": summary(mtime=SDE + 1)
                                                  for i in range(25)}}, ["COPY many"])
    lines = list(report_lines(diff_images("img", existing, rebuilt)))
    assert lines[0] == "rebuild check: img DIFFERS: existing sha256:e, rebuilt sha256:r"
    assert lines[1] == "  layer 1 (COPY many): sha256:l1 -> sha256:l2"
    assert lines[2] == f"    /f00: mtime ({SDE} -> {SDE + 1})"
    assert lines[-1] == "    ... and 5 more path(s) (--json lists all)"
    same = diff_images("img", existing, replace(existing))
    assert list(report_lines(same)) == ["rebuild check: img is reproducible (sha256:e)"]


def test_a_layer_that_differs_only_in_tar_bytes_says_so():
    files = {"a": summary()}
    report = diff_images("img", snapshot("sha256:e", {"sha256:1": files}, ["COPY a"]),
                         snapshot("sha256:r", {"sha256:2": files}, ["COPY a"]))
    assert "same paths and metadata; the tar bytes differ" in "\n".join(report_lines(report))


# --- reading layers ----------------------------------------------------------------------


def test_layer_summaries_hash_content_and_keep_metadata():
    raw = layer_tar([
        member("./opt", None),
        member("opt/a.txt", b"hello", uid=5, gid=6, uname="u", gname="g", mtime=LATER),
        member("opt/link", None, type=tarfile.SYMTYPE, linkname="a.txt"),
    ])
    found = summarize_layer(io.BytesIO(raw))
    assert found["opt/a.txt"] == summary(
        uid=5, gid=6, owner_names="u:g", mtime=LATER, size=5,
        sha256=hashlib.sha256(b"hello").hexdigest())
    assert found["opt"].type == "dir"
    assert found["opt/link"].linkname == "a.txt"


def test_one_save_stream_gives_both_images():
    engine = FakeEngine()
    shared = layer_tar([member("etc/os-release", b"debian")])
    a = engine.add(raw_config("x", "c", "p"), [shared, layer_tar([member("opt/t", b"1")])])
    b = engine.add(raw_config("y", "d", "p"), [shared, layer_tar([member("opt/t", b"2")])])

    snaps = snapshot_images(engine, (a, b))
    report = diff_images("img", snaps[a], snaps[b])
    assert [(layer.index, [p.path for p in layer.paths]) for layer in report.layers] == [
        (2, ["opt/t"])]
    assert {c.field for c in report.config} == {
        "created", "container", "container_config.Hostname", "history[1].created",
        "history[2].created"}


# --- the check's flow with a fake engine ---------------------------------------------


@dataclass
class Builds:
    """The fake engine's recipe: the base layer, then two layers written at build time."""

    base: bytes
    verify_content: bytes = b"v"

    def __call__(self, request: BuildRequest, count: int) -> tuple[dict, list[bytes]]:
        mtime = LATER + count * 100  # every build writes at its own time
        layers = [self.base,
                  layer_tar([member("opt/stackpin/venv/x.py", b"x", mtime=mtime)]),
                  layer_tar([member("opt/stackpin/built-at", self.verify_content, mtime=mtime)])]
        config = raw_config(f"2026-11-30T04:{count:02d}:00Z", f"{count:064x}", "sha256:p")
        config["history"] = [{"created_by": "bootstrap"}, {"created_by": "COPY --from=install"},
                             {"created_by": "/bin/sh -c date +%s%N > /opt/stackpin/built-at"}]
        return config, layers


@pytest.fixture
def cpu_plan(root: Path, shipped_cells, monkeypatch: pytest.MonkeyPatch):
    lock = read_lock(root, CPU_CELL)
    assert lock is not None
    staged: list[object] = []
    monkeypatch.setattr(rebuild_module, "stage", lambda plan_, root_: staged.append(plan_))
    target = Target(cell=shipped_cells[CPU_CELL], variant="stable", lock=lock,
                    layout=Layout(root))
    return plan(target, no_cache=False, provenance={})


def existing_image(engine: FakeEngine, cpu_plan, tmp_path: Path) -> str:
    raw = engine.build(cpu_plan.request).image_id
    base_diff = f"sha256:{hashlib.sha256(engine.recipe.base).hexdigest()}"
    return normalize_image(engine, NormalizeRequest(
        image=raw, tags=cpu_plan.request.tags, keep_diff_ids=frozenset({base_diff}),
        work_dir=tmp_path)).image_id


def base_engine(kind: str = "docker20") -> tuple[FakeEngine, str]:
    base = layer_tar([member("etc/os-release", b"debian", mtime=SDE)])
    engine = FakeEngine(kind=kind, recipe=Builds(base))
    base_id = engine.add(raw_config("2025", "0" * 64, ""), [base])
    return engine, base_id


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_a_deterministic_rebuild_passes_and_leaves_nothing(cpu_plan, tmp_path: Path, kind):
    engine, base_id = base_engine(kind)
    existing = existing_image(engine, cpu_plan, tmp_path)
    tags_before = dict(engine.tags)
    report = check_rebuild(engine, cpu_plan, root=tmp_path, base_id=base_id, on_line=print)
    assert report.identical and report.existing_id == existing
    assert engine.builds[-1].nocache is True
    (temp,) = engine.builds[-1].tags
    assert ":rebuild-check-stable-" in temp
    assert engine.tags == tags_before  # the temporary tag is gone, the real ones untouched
    assert existing in engine.images
    assert len(engine.removed) == 2  # the temporary tag and the rebuild's raw image


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_an_injected_timestamp_is_named_and_the_rebuild_removed(cpu_plan, tmp_path: Path, kind):
    engine, base_id = base_engine(kind)
    existing = existing_image(engine, cpu_plan, tmp_path)
    engine.recipe.verify_content = b"1796011797123456789"
    report = check_rebuild(engine, cpu_plan, root=tmp_path, base_id=base_id, on_line=print)
    assert not report.identical
    (layer,) = report.layers
    assert layer.index == 3
    assert "built-at" in layer.created_by
    assert [(p.path, p.kinds) for p in layer.paths] == [("opt/stackpin/built-at", ("content",))]
    assert differing_paths(report) == ["/opt/stackpin/built-at"]
    assert report.rebuilt_id not in engine.images  # removed in finally
    assert set(engine.images) >= {existing, base_id}


def test_a_failed_rebuild_still_cleans_up(cpu_plan, tmp_path: Path):
    engine, base_id = base_engine()
    existing_image(engine, cpu_plan, tmp_path)
    engine.fail_builds = True
    with pytest.raises(BuildError, match="boom"):
        check_rebuild(engine, cpu_plan, root=tmp_path, base_id=base_id, on_line=print)
    assert ":rebuild-check-" in engine.removed[0]
    assert not any(":rebuild-check-" in t for t in engine.tags)


def test_nothing_to_check_says_to_build_first(cpu_plan, tmp_path: Path):
    engine, base_id = base_engine()
    with pytest.raises(HostEnvironmentError, match=f"stackpin build {CPU_CELL} --variant stable"):
        check_rebuild(engine, cpu_plan, root=tmp_path, base_id=base_id, on_line=print)
    assert engine.builds == []


def test_with_the_cache_the_raw_image_is_kept(cpu_plan, tmp_path: Path):
    engine, base_id = base_engine()
    existing_image(engine, cpu_plan, tmp_path)
    report = check_rebuild(engine, cpu_plan, root=tmp_path, base_id=base_id, on_line=print,
                           no_cache=False)
    assert report.identical
    assert engine.builds[-1].nocache is False
    assert len(engine.removed) == 1  # only the temporary tag


def test_the_image_to_compare_with_can_be_named(cpu_plan, tmp_path: Path):
    engine, base_id = base_engine()
    existing = existing_image(engine, cpu_plan, tmp_path)
    for tag in cpu_plan.request.tags:  # another session moved the tags away
        engine.tags.pop(tag)
    report = check_rebuild(engine, cpu_plan, root=tmp_path, base_id=base_id, on_line=print,
                           existing_ref=existing)
    assert report.identical and report.reference == existing


NATIVE = BuilderChoice(builder="buildkit", native_timestamps=True, reason="test",
                       rewrite_timestamps=True)


def test_native_timestamps_are_compared_as_built_never_normalised(cpu_plan, tmp_path: Path):
    # The engine's BuildKit rewrote the timestamps: a rebuild is compared as it came out,
    # so a differing build-time date is reported, not normalised away.
    engine, base_id = base_engine("containerd")
    native = replace(cpu_plan, request=replace(cpu_plan.request, builder="buildkit",
                                               rewrite_timestamps=True,
                                               native_timestamps=True))
    existing = engine.build(native.request).image_id
    report = check_rebuild(engine, native, root=tmp_path, base_id=base_id, on_line=print)
    assert engine.builds[-1].rewrite_timestamps and engine.builds[-1].builder == "buildkit"
    assert engine.loaded == []  # nothing saved, rewritten and loaded back
    assert not report.identical and report.existing_id == existing
    assert any(change.field == "created" for change in report.config)


def test_the_plan_carries_the_builder_choice(cpu_plan):
    target = cpu_plan.target
    buildkit = plan(target, no_cache=True, provenance={}, builder=NATIVE)
    request = buildkit.request
    assert (request.builder, request.rewrite_timestamps, request.native_timestamps) == (
        "buildkit", True, True)
    assert (cpu_plan.request.builder, cpu_plan.request.rewrite_timestamps,
            cpu_plan.request.native_timestamps) == ("classic", False, False)
    # Each builder gets its own Dockerfile, and the labels name the one it gets.
    assert "RUN --mount=type=bind" in buildkit.rendered.dockerfile
    assert "COPY --from=install" in cpu_plan.rendered.dockerfile
    assert (request.labels[LABEL_DOCKERFILE_SHA256]
            == sha256_text(buildkit.rendered.dockerfile)
            != cpu_plan.request.labels[LABEL_DOCKERFILE_SHA256])
