"""--with-wheels bundles: the folder is a project that rebuilds its images offline."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from test_bundle_fakes import (
    CPU_CELL,
    PROBE_OUTPUT,
    ROOT,
    FakeEngine,
    add_image,
    cpu_dockerfile,
    cpu_selection,
    engine_with_cpu,
    export_cpu,
    project,
    record_cpu_build,
    site_trusting,
)
from tests.conftest import pin_fake_installer

from stackpin import signing, tools
from stackpin.build import sha256_text
from stackpin.bundle import format as bundle_format
from stackpin.bundle import source
from stackpin.bundle import verify as verifying
from stackpin.errors import BundleError, HostEnvironmentError
from stackpin.lock import LockedWheel
from stackpin.render import base_reference
from stackpin.session import source_commit
from stackpin.target import LABEL_DOCKERFILE_SHA256

COMMIT = "ab" * 20


def _small_wheelhouse(root: Path, shipped_cells) -> bundle_format.Selection:
    """The CPU selection with a two-wheel lock whose files exist (not 300 MB of torch)."""
    selection = cpu_selection(shipped_cells)
    folder = root / "wheels" / CPU_CELL
    folder.mkdir(parents=True)
    wheels = []
    for name in ("alpha", "beta"):
        filename = f"{name}-1.0-py3-none-any.whl"
        data = f"wheel {name}".encode()
        (folder / filename).write_bytes(data)
        wheels.append(LockedWheel(name=name, version="1.0", filename=filename,
                                  sha256=hashlib.sha256(data).hexdigest(), group="stack",
                                  source="index"))
    lock = dataclasses.replace(selection.lock, wheels=tuple(wheels))
    return dataclasses.replace(selection, lock=lock)


INSTALLER_BYTES = b"the pinned installer wheel"


def _pinning(root: Path) -> None:
    """The repository's matrices and locks, and an installer pin naming a small wheel here."""
    (root / "pinning").mkdir()
    for item in (ROOT / "pinning").iterdir():
        if item.name != "tools":
            (root / "pinning" / item.name).symlink_to(item)
    pin_fake_installer(root, INSTALLER_BYTES)


def _export(tmp_path: Path, shipped_cells, *, commits: tuple[str, ...] = (COMMIT,)):
    root = project(tmp_path)
    _pinning(root)
    (root / "verify").symlink_to(ROOT / "verify")
    selection = _small_wheelhouse(root, shipped_cells)
    engine = FakeEngine(run_stdout=PROBE_OUTPUT + "\n")
    engine.add({"created": "2025-01-01T00:00:00Z"}, [b"base rootfs"],
               tags=(base_reference(selection.cell),))
    add_image(engine, selection.cell, "stable", selection.lock.digest,
              labels={"io.stackpin.source-commit": commits[0],
                      LABEL_DOCKERFILE_SHA256: sha256_text(cpu_dockerfile(selection))})
    record_cpu_build(root, engine, selection)
    signing.generate(tmp_path / "keys")
    request = bundle_format.ExportRequest(
        selections=(selection,), out_dir=tmp_path / "out" / "bundle", root=root,
        with_wheels=True, signer=signing.Signer.load(tmp_path / "keys" / "stackpin.key"))
    from stackpin.bundle import export as exporting
    return exporting.export(engine, request), engine, selection


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_a_with_wheels_bundle_is_a_project_that_names_its_commit(tmp_path, shipped_cells):
    result, _engine, selection = _export(tmp_path, shipped_cells)
    out = result.out_dir
    files = _files(out)
    assert {p.name for p in (ROOT / "pinning").glob("*.toml")} == {
        Path(f).name for f in files
        if f.startswith("pinning/") and f.endswith(".toml") and f != tools.PIN.as_posix()}
    assert (out / "pinning/locks" / f"{CPU_CELL}.lock").read_text() == selection.lock.text()
    templates = {p.relative_to(ROOT).as_posix() for p in (ROOT / "templates").rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    assert templates <= files
    assert "verify/stackpin_verify/__init__.py" in files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    assert {f"wheels/{CPU_CELL}/alpha-1.0-py3-none-any.whl",
            f"wheels/{CPU_CELL}/beta-1.0-py3-none-any.whl"} <= files
    # The installer every build runs, pinned apart from the lock, travels with it.
    wheel = (tools.TOOLS_DIR / tools.load_installer(ROOT).wheel).as_posix()
    assert {tools.PIN.as_posix(), wheel} <= files
    assert (out / wheel).read_bytes() == INSTALLER_BYTES
    assert (out / "SOURCE_COMMIT").read_text() == COMMIT + "\n"
    assert source_commit(out) == COMMIT  # what a build in this folder labels its image
    listed = {f["path"] for f in json.loads((out / "manifest.json").read_bytes())["files"]}
    assert files - {"manifest.json", "manifest.sig"} == listed
    site = site_trusting(tmp_path / "keys" / "stackpin.pub")
    assert verifying.verify(out, site=site).files == len(listed)


def test_the_bundled_base_loads_as_the_same_image_on_an_empty_daemon(tmp_path, shipped_cells):
    result, engine, selection = _export(tmp_path, shipped_cells)
    reference = base_reference(selection.cell)
    site = FakeEngine()
    source.load_bundled_base(site, selection.cell, result.out_dir, on_line=print)
    loaded = site.image_info(reference)
    assert loaded is not None
    original = engine.image_info(reference)
    assert original is not None
    assert loaded.id == original.id


def test_offline_without_a_base_says_what_to_do(tmp_path, shipped_cells):
    cell = cpu_selection(shipped_cells).cell
    with pytest.raises(HostEnvironmentError, match=r"--offline: the base .* is not on this "
                       r"daemon and .*base/cpu-bookworm-torch2130-py311.tar.zst does not exist"):
        source.load_bundled_base(FakeEngine(), cell, tmp_path, on_line=print)


def test_offline_with_the_base_present_loads_nothing(tmp_path, shipped_cells):
    engine = engine_with_cpu(shipped_cells)
    source.load_bundled_base(engine, cpu_selection(shipped_cells).cell, tmp_path, on_line=print)
    assert engine.loaded == []


def test_a_bundle_without_wheels_carries_no_rebuild_inputs(tmp_path, shipped_cells):
    result, _ = export_cpu(tmp_path, shipped_cells)
    files = _files(result.out_dir)
    assert not [f for f in files if f.startswith(("pinning/", "templates/", "verify/", "base/",
                                                  "wheels/"))]
    assert "SOURCE_COMMIT" not in files


def test_images_of_two_commits_cannot_share_one_rebuild_bundle():
    def image(commit: str) -> bundle_format.BundleImage:
        return bundle_format.BundleImage(
            cell="c", variant="stable", profile="stable", port=1, platform="cpu",
            cpu_arch="x86_64", arch=(), id="sha256:" + "0" * 64, tags=("t",),
            labels={"io.stackpin.source-commit": commit}, run={}, size=1)
    with pytest.raises(BundleError, match="built from different commits"):
        source.images_commit([image("a" * 40), image("b" * 40)])


@pytest.mark.parametrize("text", ["not a commit", "ab" * 19, COMMIT + "; rm -rf /"])
def test_a_recorded_commit_must_look_like_one(tmp_path, text):
    (tmp_path / "SOURCE_COMMIT").write_text(text + "\n")
    with pytest.raises(BundleError, match="not a commit"):
        source.recorded_commit(tmp_path)


def test_outside_git_and_bundles_the_commit_is_unknown(tmp_path):
    assert source_commit(tmp_path) == "unknown"
    (tmp_path / "SOURCE_COMMIT").write_text(COMMIT + "+dirty\n")
    assert source_commit(tmp_path) == COMMIT + "+dirty"


def test_export_never_reads_a_file_of_the_bundle_again_to_hash_it(tmp_path, shipped_cells,
                                                                 monkeypatch):
    """Wheels are hashed while copied, image and base streams while written, documents
    from their bytes: SHA256SUMS and the manifest come from those, in one pass."""
    from stackpin.bundle import export as exporting
    reread: list[Path] = []
    monkeypatch.setattr(exporting, "sha256_file", lambda path: reread.append(path) or "")
    result, _, _ = _export(tmp_path, shipped_cells)
    assert reread == []
    sums = (result.out_dir / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    listed = {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in sums}
    assert any(p.endswith(".whl") for p in listed) and any(p.startswith("base") for p in listed)
    for path, digest in listed.items():  # what was listed is what is there
        assert hashlib.sha256((result.out_dir / path).read_bytes()).hexdigest() == digest
