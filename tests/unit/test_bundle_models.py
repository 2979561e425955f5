"""models/ in bundles (shipped only when asked, with their licences) and no user state, ever."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from test_bundle_fakes import CPU_CELL, export_cpu, project, site_trusting, unzstd

from stackpin import primitives, sbom
from stackpin.bundle import models
from stackpin.bundle import verify as verifying
from stackpin.errors import BundleError

MARKER = "stackpin-user-state-marker-7f3a"  # in every state file; must be in no bundle file


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def _model(root: Path, name: str = "tiny", *, card: str | None = "---\nlicense: apache-2.0\n---\n"
           ) -> Path:
    folder = root / "models" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen2"}\n')
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    if card is not None:
        (folder / "README.md").write_text(card + "# tiny\n")
        (folder / "LICENSE").write_text("Apache License, Version 2.0\n")
    return folder


def _studio_state(folder: Path) -> Path:
    """What Studio leaves in a state folder: accounts, chats, the first-start password."""
    (folder / "auth").mkdir(parents=True)
    with sqlite3.connect(folder / "auth" / "auth.db") as db:
        db.execute("CREATE TABLE users (name TEXT, password_hash TEXT)")
        db.execute("INSERT INTO users VALUES ('unsloth', ?)", (MARKER,))
    with sqlite3.connect(folder / "studio.db") as db:
        db.execute("CREATE TABLE chat_messages (thread TEXT, role TEXT, content TEXT)")
        db.execute("INSERT INTO chat_messages VALUES ('t1', 'user', ?)", (MARKER,))
    (folder / "auth" / ".bootstrap_password").write_text(MARKER + "\n")
    return folder


def _contains_marker(bundle: Path) -> list[str]:
    hits = [rel for rel in _files(bundle) if MARKER.encode() in (bundle / rel).read_bytes()]
    raw = unzstd(
        (bundle / "images.tar.zst").read_bytes())
    return hits + (["images.tar.zst (decompressed)"] if MARKER.encode() in raw else [])


# --- the convention ------------------------------------------------------------------------


def test_every_bundle_has_a_models_folder_but_no_model_unless_asked(tmp_path, shipped_cells):
    root = project(tmp_path)
    _model(root)
    result, public = export_cpu(tmp_path, shipped_cells)
    out = result.out_dir
    assert (out / "models" / "README.md").read_text() == models.README
    assert not [f for f in _files(out) if f.startswith(("models/tiny", "licenses/models"))]
    assert not (out / "sbom" / "models.cdx.json").exists()
    assert verifying.verify(out, site=site_trusting(public)).signature == "verified"


def test_with_models_ships_each_model_its_licence_and_an_sbom_of_them(tmp_path, shipped_cells):
    root = project(tmp_path)
    source = _model(root)
    result, public = export_cpu(tmp_path, shipped_cells, with_models=True)
    out = result.out_dir
    for name in ("config.json", "model.safetensors", "README.md", "LICENSE"):
        assert (out / "models" / "tiny" / name).read_bytes() == (source / name).read_bytes()
    assert (out / "licenses/models/tiny/LICENSE").read_text() == "Apache License, Version 2.0\n"
    data = (out / "sbom" / "models.cdx.json").read_bytes()
    assert sbom.schema_errors(data) is None
    (model,) = json.loads(data)["components"]
    assert (model["type"], model["name"]) == ("machine-learning-model", "tiny")
    assert model["licenses"] == [{"license": {"id": "Apache-2.0"}}]
    weights = {c["name"]: c["hashes"][0]["content"] for c in model["components"]}
    assert weights["models/tiny/model.safetensors"] == primitives.sha256_file(
        source / "model.safetensors")
    manifest = {f["path"] for f in json.loads((out / "manifest.json").read_bytes())["files"]}
    assert {"models/tiny/model.safetensors", "sbom/models.cdx.json"} <= manifest
    assert verifying.verify(out, site=site_trusting(public)).signature == "verified"


def test_a_model_without_a_declared_licence_is_refused_and_nothing_written(tmp_path,
                                                                          shipped_cells):
    root = project(tmp_path)
    _model(root, card=None)
    with pytest.raises(BundleError, match=r"models/tiny declares no licence: add a README.md"):
        export_cpu(tmp_path, shipped_cells, with_models=True)
    assert not (tmp_path / "out" / "bundle").exists()


@pytest.mark.parametrize(("card", "licence"), [
    ("---\nlicense: mit\n---\n", "MIT"),
    ("---\nlanguage: en\nlicense: 'apache-2.0'  # from the hub\ntags: [x]\n---\n", "Apache-2.0"),
    ("---\nlicense: llama3\n---\n", "llama3"),
    ("license: mit\n", None),  # not front matter: prose that says so is not a declaration
    ("---\ntags: [license: mit]\n---\n", None),
])
def test_card_licence_reads_front_matter_only(card, licence):
    assert models.card_licence(card + "\n# body\nlicense: gpl-3.0\n") == licence


def test_a_folder_without_weights_is_not_a_model(tmp_path):
    (tmp_path / "models" / "notes").mkdir(parents=True)
    (tmp_path / "models" / "notes" / "README.md").write_text("---\nlicense: mit\n---\n")
    with pytest.raises(BundleError, match=r"models/notes holds no \.safetensors or \.gguf"):
        models.find_models(tmp_path / "models")


# --- no user state ---------------------------------------------------------------------------


def test_a_state_folder_beside_the_project_stays_out_of_every_bundle(tmp_path, shipped_cells):
    # Where `stackpin serve` keeps state on the build host, with a real password database and
    # chat history; exported with every option that copies folders.
    root = project(tmp_path)
    state = _studio_state(root / "build" / "state" / f"{CPU_CELL}-stable" / "studio")
    assert (state / "studio.db").read_bytes().startswith(b"SQLite format 3")
    _model(root)
    result, _ = export_cpu(tmp_path, shipped_cells, with_models=True, archive=True)
    out = result.out_dir
    names = _files(out)
    assert not [f for f in names if Path(f).name in {"auth.db", "studio.db", ".bootstrap_password"}]
    assert _contains_marker(out) == []
    assert result.archive is not None
    assert MARKER.encode() not in result.archive.read_bytes()


@pytest.mark.parametrize("where", ["models/tiny/.studio", f"build/reports/{CPU_CELL}-stable/run"])
def test_state_inside_a_folder_the_bundle_copies_is_refused(tmp_path, shipped_cells, where):
    # A state folder put where export copies from (the models, the build reports) must stop
    # the export, not travel: one line, exit 7 at the CLI, nothing at the target.
    root = project(tmp_path)
    _model(root)
    _studio_state(root / where)
    with pytest.raises(BundleError, match=r"a bundle never carries user state"):
        export_cpu(tmp_path, shipped_cells, with_models=True)
    assert not (tmp_path / "out" / "bundle").exists()


def test_user_state_check_needs_the_content_not_the_name(tmp_path):
    renamed = tmp_path / "weights.bin"
    with sqlite3.connect(renamed) as db:
        db.execute("CREATE TABLE t (x)")
    assert "SQLite" in str(models.user_state_problem(renamed))
    plain = tmp_path / "auth.db.txt"
    plain.write_text("not a database")
    assert models.user_state_problem(plain) is None


# --- the site's own models -------------------------------------------------------------------


def test_models_the_site_adds_are_not_extra_files_but_shipped_ones_stay_checked(
        tmp_path, shipped_cells):
    root = project(tmp_path)
    _model(root)
    result, public = export_cpu(tmp_path, shipped_cells, with_models=True)
    out = result.out_dir
    (out / "models" / "site-model").mkdir()
    (out / "models" / "site-model" / "model.gguf").write_bytes(b"GGUF")
    assert verifying.verify(out, site=site_trusting(public)).signature == "verified"
    (out / "models" / "tiny" / "model.safetensors").write_bytes(b"altered")
    with pytest.raises(BundleError, match=r"models/tiny/model.safetensors is 7 bytes"):
        verifying.verify(out, site=site_trusting(public))


def test_an_unlisted_file_outside_models_is_still_an_extra_file(tmp_path, shipped_cells):
    result, public = export_cpu(tmp_path, shipped_cells)
    (result.out_dir / "locks" / "models").mkdir()
    (result.out_dir / "locks" / "models" / "x.gguf").write_bytes(b"GGUF")
    with pytest.raises(BundleError, match=r"locks/models/x.gguf is not in the manifest"):
        verifying.verify(result.out_dir, site=site_trusting(public))
