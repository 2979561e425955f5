"""Bundle export, determinism, verification and tampering, without a daemon."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import tarfile
import threading
from pathlib import Path

import pytest
from test_bundle_fakes import (
    CPU_CELL,
    EPOCH,
    PROBE_OUTPUT,
    STUDIO_NOTICE,
    add_image,
    cpu_selection,
    engine_with_cpu,
    export_cpu,
    layer_bytes,
    project,
    record_cpu_build,
    site_trusting,
    unzstd,
)
from tests.conftest import ROOT
from tests.fake_engine import FakeEngine

from stackpin import sbom, signing
from stackpin.build import load_record, measure_image, write_record
from stackpin.bundle import format as bundle_format
from stackpin.bundle import secrets as bundle_secrets
from stackpin.bundle import siteconf
from stackpin.bundle import stream as streaming
from stackpin.bundle import verify as verifying
from stackpin.engine import SaveRequest
from stackpin.engine.save_format import read_save
from stackpin.errors import BundleError, HostEnvironmentError
from stackpin.matrix import RunFlags
from stackpin.primitives import sha256_file
from stackpin.render import base_reference
from stackpin.target import Layout, Target


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# --- export -------------------------------------------------------------------------------


def test_export_writes_the_layout_and_a_manifest_covering_every_file(tmp_path, shipped_cells):
    result, public = export_cpu(tmp_path, shipped_cells)
    out = result.out_dir
    files = _files(out)
    assert files == sorted([
        "README.md", "SHA256SUMS", "images.tar.zst", "manifest.json", "manifest.sig",
        "bin/bundle.conf", "bin/profiles/stable.conf", "bin/inventory.sh", "bin/lib.sh",
        "bin/load.sh", "bin/preflight.sh", "bin/pull.sh", "bin/push.sh", "bin/registry.sh",
        "bin/start.sh", "bin/stop.sh", "bin/verify.sh",
        f"dockerfiles/{CPU_CELL}-stable.Dockerfile", f"locks/{CPU_CELL}.lock",
        f"locks/{CPU_CELL}.cell.json", f"sbom/{CPU_CELL}-stable.cdx.json", f"reports/{CPU_CELL}-stable/report.json",
        f"reports/{CPU_CELL}-stable/verified.json",
        f"provenance/{CPU_CELL}.intoto.json", "licenses/unsloth-studio/LICENSE.AGPL-3.0",
        "models/README.md",
    ])
    manifest = json.loads((out / "manifest.json").read_bytes())
    listed = {f["path"] for f in manifest["files"]}
    assert listed == set(files) - {"manifest.json", "manifest.sig"}
    assert manifest["created"] == "2025-01-01T00:00:00Z"
    assert manifest["format_version"] == bundle_format.FORMAT_VERSION
    assert manifest["inputs"]["locks"] == {CPU_CELL: cpu_selection(shipped_cells).lock.digest}
    image = manifest["images"][0]
    assert (image["profile"], image["port"], image["platform"]) == ("stable", 18888, "cpu")
    assert image["labels"]["io.stackpin.cell"] == CPU_CELL
    assert (out / "manifest.json").read_bytes() == bundle_format.manifest_bytes(manifest)
    assert os.access(out / "bin" / "load.sh", os.X_OK)
    assert not os.access(out / "README.md", os.X_OK)
    verified = verifying.verify(out, site=site_trusting(public))
    assert verified.signature == "verified"
    assert verified.files == len(listed)


def test_images_file_is_the_save_stream_compressed_and_hashed_in_one_pass(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells)
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine)
    raw = unzstd(
        (result.out_dir / "images.tar.zst").read_bytes())
    assert len(raw) == result.stream.tar_bytes
    assert sha256_file(result.out_dir / "images.tar.zst") == result.stream.sha256
    # One save request for every tag of the selection: shared layers stored once.
    assert [r.images for r in engine.saved] == [tuple(sorted(result.images[0].tags))]
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        assert "manifest.json" in tar.getnames()


def test_a_provenance_statement_per_cell_is_covered_by_the_signature(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells, labels={
        "io.stackpin.source-commit": "ab" * 20, "io.stackpin.version": "0.1.0"})
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine)
    statement = json.loads((result.out_dir / f"provenance/{CPU_CELL}.intoto.json").read_bytes())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    image = result.images[0]
    assert statement["subject"] == [
        {"name": image.tags[0], "digest": {"sha256": image.id.removeprefix("sha256:")}}]
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    base = engine.image_info(base_reference(cpu_selection(shipped_cells).cell))
    assert base is not None
    assert deps[0]["digest"] == {"sha256": base.id.removeprefix("sha256:")}
    dockerfile = (result.out_dir / f"dockerfiles/{CPU_CELL}-stable.Dockerfile").read_bytes()
    assert {"sha256": hashlib.sha256(dockerfile).hexdigest()} in [d["digest"] for d in deps]
    manifest = json.loads((result.out_dir / "manifest.json").read_bytes())
    assert f"provenance/{CPU_CELL}.intoto.json" in {f["path"] for f in manifest["files"]}


def test_provenance_names_the_recorded_base_even_when_the_daemon_lost_it(tmp_path,
                                                                        shipped_cells):
    # The base ID comes from the build record, not from a lookup at export time.
    engine = engine_with_cpu(shipped_cells)
    selection = cpu_selection(shipped_cells)
    base = engine.image_info(base_reference(selection.cell))
    assert base is not None
    record_cpu_build(project(tmp_path), engine, selection)
    engine.remove_image(base_reference(selection.cell))
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine)
    statement = json.loads((result.out_dir / f"provenance/{CPU_CELL}.intoto.json").read_bytes())
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert deps[0]["digest"] == {"sha256": base.id.removeprefix("sha256:")}


def test_the_sbom_is_read_from_the_image_by_a_container_run(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells)
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine)
    (run,) = engine.runs
    assert run.image == result.images[0].id
    assert run.network_mode == "none"
    doc = json.loads((result.out_dir / f"sbom/{CPU_CELL}-stable.cdx.json").read_text())
    assert doc["specVersion"] == "1.6"
    assert sbom.schema_errors((result.out_dir / f"sbom/{CPU_CELL}-stable.cdx.json").read_bytes()) is None
    purls = [c["purl"] for c in doc["components"]]
    assert "pkg:pypi/torch@2.13.0%2Bcpu" in purls
    assert "pkg:deb/debian/python3@3.11.2-1%2Bb1?arch=amd64" in purls


def test_studio_s_agpl_notice_is_shipped_and_recorded_in_the_sbom(tmp_path, shipped_cells):
    result, _ = export_cpu(tmp_path, shipped_cells)
    notice = result.out_dir / "licenses/unsloth-studio/LICENSE.AGPL-3.0"
    assert notice.read_text() == STUDIO_NOTICE  # the image's own file, as the probe read it
    doc = json.loads((result.out_dir / f"sbom/{CPU_CELL}-stable.cdx.json").read_text())
    (studio,) = [c for c in doc["components"] if c["name"] == "unsloth-studio"]
    assert studio["licenses"] == [{"expression": "AGPL-3.0-only"}]
    assert studio["purl"] == "pkg:pypi/unsloth@2026.10.9#studio"
    assert {"name": "io.stackpin:notice", "value": "licenses/unsloth-studio/LICENSE.AGPL-3.0"} in studio["properties"]


def test_two_exports_are_byte_identical_whatever_the_thread_count(tmp_path, shipped_cells):
    first, _ = export_cpu(tmp_path, shipped_cells, name="a", zstd_threads=1, archive=True)
    second, _ = export_cpu(tmp_path, shipped_cells, name="b", zstd_threads=4, archive=True)
    assert _files(first.out_dir) == _files(second.out_dir)
    for rel in _files(first.out_dir):  # the signature too: ed25519 is deterministic
        assert (first.out_dir / rel).read_bytes() == (second.out_dir / rel).read_bytes(), rel
    assert first.archive is not None
    assert second.archive is not None
    # Same content under another top folder name: same length, fixed headers.
    assert len(first.archive.read_bytes()) == len(second.archive.read_bytes())


def test_same_key_same_signature_and_same_archive(tmp_path, shipped_cells):
    first, _ = export_cpu(tmp_path, shipped_cells, name="one", archive=True)
    shutil.rmtree(tmp_path / "out" / "one")
    second, _ = export_cpu(tmp_path, shipped_cells, name="one", archive=True, force=True)
    assert first.archive is not None
    assert second.archive is not None
    assert (second.out_dir / "manifest.sig").stat().st_size == signing.SIGNATURE_BYTES
    assert first.archive.read_bytes() == second.archive.read_bytes()


def test_an_existing_bundle_is_kept_unless_forced(tmp_path, shipped_cells):
    export_cpu(tmp_path, shipped_cells)
    with pytest.raises(BundleError, match="exists: choose another -o or pass --force"):
        export_cpu(tmp_path, shipped_cells)
    result, public = export_cpu(tmp_path, shipped_cells, force=True)
    assert verifying.verify(result.out_dir, site=site_trusting(public)).signature == "verified"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["bundle"]


def test_an_interrupted_export_leaves_nothing_and_a_rerun_succeeds(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells)
    engine.interrupt_after = 10
    with pytest.raises(KeyboardInterrupt):
        export_cpu(tmp_path, shipped_cells, engine=engine)
    assert list((tmp_path / "out").iterdir()) == []
    # A partial folder of an export that was SIGKILLed (its pid is gone) is swept away.
    stale = tmp_path / "out" / ".bundle.partial-999999999"
    stale.mkdir()
    (stale / "images.tar.zst").write_bytes(b"half")
    engine.interrupt_after = None
    result, public = export_cpu(tmp_path, shipped_cells, engine=engine)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["bundle"]
    verifying.verify(result.out_dir, site=site_trusting(public))


def test_export_refuses_a_missing_image_or_one_built_from_another_lock(tmp_path, shipped_cells):
    with pytest.raises(BundleError, match=f"build it first with `stackpin build {CPU_CELL}"):
        export_cpu(tmp_path, shipped_cells, engine=FakeEngine())
    selection = cpu_selection(shipped_cells)
    engine = FakeEngine()
    add_image(engine, selection.cell, "stable", selection.lock.digest,
              labels={"io.stackpin.lock-digest": "0" * 64})
    with pytest.raises(BundleError, match="rebuild it"):
        export_cpu(tmp_path, shipped_cells, engine=engine)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


# --- secrets ------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "labels"), [
    (("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyzABCDEFGH",), {}),
    (("DB_PASSWORD=hunter22",), {}),
    ((), {"io.example.api-key": "sk-live-1234567890"}),
    ((), {"io.example.note": "password=hunter22"}),
    (("PIP_INDEX_URL=https://user:pa55word@pypi.example/simple",), {}),
])
def test_export_refuses_secrets_in_the_image_config(tmp_path, shipped_cells, env, labels):
    engine = engine_with_cpu(shipped_cells, env=env, labels=labels)
    with pytest.raises(BundleError, match="a bundle never carries secrets") as caught:
        export_cpu(tmp_path, shipped_cells, engine=engine)
    for secret in ("hf_abcdefghij", "hunter22", "sk-live", "pa55word"):
        assert secret not in caught.value.message  # the message never repeats the secret
    assert engine.saved == []  # refused before the daemon streamed anything


@pytest.mark.parametrize("content", [
    b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaA==\n-----END OPENSSH PRIVATE KEY-----\n",
    b'{"token_note": "x", "password": "correct-horse"}\n',
    b"ghp_0123456789abcdefghijklmnopqrstuvwxyzAB\n",
    b"AKIAIOSFODNN7EXAMPLE\n",
])
def test_export_refuses_secrets_in_bundle_files_and_leaves_nothing(tmp_path, shipped_cells,
                                                                  content):
    project(tmp_path, report=content)
    with pytest.raises(BundleError, match=rf"reports/{CPU_CELL}-stable/report\.json holds"):
        export_cpu(tmp_path, shipped_cells)
    assert list((tmp_path / "out").iterdir()) == []


def test_ordinary_names_are_not_secrets():
    assert bundle_secrets.find_secret(b"TOKENIZERS_PARALLELISM=false\nHF_HUB_OFFLINE=1\n") is None
    assert bundle_secrets.find_secret(b"pip install --hash=sha256:" + b"a" * 64) is None
    assert bundle_secrets.find_secret(b"secretstorage==3.3.3 keyring==25.0") is None


# --- pure pieces --------------------------------------------------------------------------


def test_profiles_are_variants_and_several_cells_get_their_own_names_and_ports():
    assert bundle_format.assign_profiles([("c", "stable"), ("c", "enhanced")]) == [
        ("stable", 18888), ("enhanced", 18887)]
    assert bundle_format.assign_profiles([("a", "stable"), ("b", "stable"), ("b", "enhanced")]) == [
        ("a.stable", 18888), ("b.stable", 18886), ("enhanced", 18885)]


def test_dtk_run_flags_reach_the_profile_as_docker_options(shipped_cells):
    dtk = next(c for c in shipped_cells.values() if c.platform == "dtk")
    flags = RunFlags(devices=("/dev/kfd", "/dev/dri", "/dev/mkfd"), group_add=("video",),
                     volumes=("/opt/hyhal:/opt/hyhal:ro",), shm_size="32g")
    args = siteconf.docker_run_args(bundle_format.run_flags_json(flags))
    assert args == ["--device=/dev/kfd", "--device=/dev/dri", "--device=/dev/mkfd",
                    "--group-add=video", "--volume=/opt/hyhal:/opt/hyhal:ro", "--shm-size=32g"]
    image = bundle_format.BundleImage(
        cell=dtk.id, variant="enhanced", profile="enhanced", port=18887, platform="dtk",
        cpu_arch="x86_64", arch=("gfx928",), id="sha256:" + "1" * 64, tags=("s/x:enhanced-1",),
        labels={}, run=bundle_format.run_flags_json(flags), size=1)
    conf = siteconf.profile_conf(image)
    assert "PROFILE_RUN_ARGS=(--device=/dev/kfd --device=/dev/dri --device=/dev/mkfd" in conf
    assert "PROFILE_PORT=18887\n" in conf
    stats = bundle_format.StreamStats(tar_bytes=10, bytes=5, sha256="0" * 64)
    conf = siteconf.bundle_conf([image], stats)
    # The DTK spec's probes, then the profile's own device nodes, each once.
    assert "BUNDLE_PROBE_TARGETS=(/dev/kfd /dev/dri /opt/hyhal /dev/mkfd)\n" in conf
    assert "BUNDLE_PROBE_KINDS=(node node folder node)\n" in conf
    assert "BUNDLE_HOST_PATHS=(/opt/hyhal)\n" in conf
    assert "BUNDLE_SHM_SIZES=(32g)\n" in conf
    assert "BUNDLE_ARCHES=(gfx928)\n" in conf


def test_shell_data_is_quoted(shipped_cells):
    assert siteconf.shell_assign("X", ["a b", "$(rm -rf /)"]) == "X=('a b' '$(rm -rf /)')\n"


def test_created_is_the_newest_source_date_epoch(shipped_cells):
    selection = cpu_selection(shipped_cells)
    assert bundle_format.created_epoch([selection.cell]) == EPOCH


def _stream_of(engine: FakeEngine, tmp_path: Path, name: str) -> tuple[bytes, dict]:
    path = tmp_path / f"{name}.tar.zst"
    _stats, bundled = streaming.write_images(engine, ["x:1", "x:2", "y:1"], path, threads=1)
    return unzstd(path.read_bytes()), bundled


@pytest.mark.parametrize("reverse", [False, True])
def test_the_images_stream_is_the_same_on_every_engine_and_store(tmp_path, reverse):
    streams = {}
    for kind in ("docker20", "classic", "containerd"):
        engine = FakeEngine(kind=kind, reverse_manifest=reverse)
        shared = layer_bytes("shared", 8192)
        a = engine.add({"n": "a"}, [shared, layer_bytes("a", 8192)], tags=("x:1",))
        b = engine.add({"n": "b"}, [shared, layer_bytes("b", 8192)], tags=("y:1", "x:2"))
        streams[kind], bundled = _stream_of(engine, tmp_path, kind)
        assert set(bundled) == {a, b}  # keyed by the exporting engine's own IDs
    assert streams["docker20"] == streams["classic"] == streams["containerd"]
    contents = read_save(io.BytesIO(streams["containerd"]), lambda data: data.read())
    assert contents.layout == "oci"
    assert {layer.compression for layer in contents.layers.values()} == {""}  # raw tar
    assert len(contents.layers) == 3  # the shared layer once
    assert sorted(e.repo_tags for e in contents.entries) == [("x:1",), ("x:2", "y:1")]


def test_each_image_is_named_as_each_store_will_name_it_after_a_load(tmp_path):
    source = FakeEngine(kind="containerd")
    image = source.add({"n": "a"}, [layer_bytes("a", 8192)], tags=("x:1",))
    path = tmp_path / "images.tar.zst"
    _stats, bundled = streaming.write_images(source, ["x:1"], path, threads=1)
    data = unzstd(path.read_bytes())
    for kind, expected in (("docker20", bundled[image].config_digest),
                           ("classic", bundled[image].config_digest),
                           ("containerd", bundled[image].manifest_digest)):
        assert FakeEngine(kind=kind).load([data]).image_ids == (expected,), kind
    assert bundled[image].manifest_digest != image  # layers no longer gzip: a new manifest


def test_a_save_stream_cut_short_is_an_error(tmp_path):
    engine = FakeEngine()
    engine.add({}, [bytes(4096)], tags=("x:1",))
    data = b"".join(engine.save(SaveRequest(images=("x:1",))))
    engine.save = lambda request: iter([data[:3000]])  # type: ignore[method-assign]
    with pytest.raises(HostEnvironmentError, match="save stream that cannot be read"):
        streaming.write_images(engine, ["x:1"], tmp_path / "images.tar.zst", threads=1)


class SaveWaitingForTheProbe(FakeEngine):
    """An engine whose save stream does not end before the SBOM probe has run: an export
    that probes only after the stream would wait here (bounded, so the test fails)."""

    def __init__(self, engine: FakeEngine) -> None:
        super().__init__(images=engine.images, tags=engine.tags, run_stdout=engine.run_stdout)
        self.probed = threading.Event()
        self.probe_during_save = False

    def run_to_completion(self, request, *, timeout_s):
        self.probed.set()
        return super().run_to_completion(request, timeout_s=timeout_s)

    def save(self, request):
        chunks = list(super().save(request))
        yield chunks[0]
        self.probe_during_save = self.probed.wait(timeout=120)
        yield from chunks[1:]


def test_the_sbom_probe_runs_beside_the_save_stream(tmp_path, shipped_cells):
    engine = SaveWaitingForTheProbe(engine_with_cpu(shipped_cells))
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine)
    assert engine.probe_during_save
    assert [r.command[0] for r in engine.runs] == ["-c"]  # one probe, the image's
    assert (result.out_dir / "sbom").is_dir()


def test_an_inventory_the_build_recorded_costs_the_export_no_container(tmp_path,
                                                                       shipped_cells):
    # The build's measuring container ran the probe (build.measure_image) and the record
    # keeps its line: the export starts no container and ships the same SBOM.
    probed, _ = export_cpu(tmp_path / "probed", shipped_cells)
    engine = engine_with_cpu(shipped_cells)
    selection = cpu_selection(shipped_cells)
    (tmp_path / "recorded").mkdir()
    root = project(tmp_path / "recorded")
    record_cpu_build(root, engine, selection)
    target = Target(cell=selection.cell, variant=selection.variant, lock=selection.lock,
                    layout=Layout(root))
    record = load_record(target)
    assert record is not None and record.inventory == ""
    engine.run_stdout = f"2051293322\t/opt/stackpin\n{PROBE_OUTPUT}\n"  # du, then the probe
    assert measure_image(engine, record.image_id) == (2051293322, PROBE_OUTPUT.strip())
    line = PROBE_OUTPUT.strip()
    write_record(target, dataclasses.replace(record, inventory=line),
                 target.layout.dockerfile_record_path(target.cell.id, target.variant).read_text())
    engine.runs.clear()
    recorded, _ = export_cpu(tmp_path / "recorded", shipped_cells, engine=engine)
    assert engine.runs == []
    name = f"sbom/{CPU_CELL}-stable.cdx.json"
    assert (recorded.out_dir / name).read_bytes() == (probed.out_dir / name).read_bytes()


def test_a_probe_that_cannot_run_leaves_no_inventory_and_the_size_still_counts(shipped_cells):
    engine = engine_with_cpu(shipped_cells)
    selection = cpu_selection(shipped_cells)
    image = engine.image_info(Target(cell=selection.cell, variant="stable", lock=selection.lock,
                                     layout=Layout(ROOT)).tags[0])
    assert image is not None
    engine.run_stdout = "2051293322\t/opt/stackpin\nTraceback: no python here\n"
    assert measure_image(engine, image.id) == (2051293322, "")
    (run,) = engine.runs
    assert (run.entrypoint, run.network_mode) == (("/bin/sh",), "none")
    assert run.command[0] == "-c" and "du -sb /opt/stackpin" in run.command[1]
