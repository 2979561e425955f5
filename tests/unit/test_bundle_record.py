"""Export reads what the build recorded: the Dockerfile that built the image, its base, and
only the reports made in that very image. Nothing is re-rendered from today's templates."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from test_bundle_fakes import (
    CPU_CELL,
    cpu_dockerfile,
    cpu_selection,
    engine_with_cpu,
    export_cpu,
    project,
    record_cpu_build,
)

from stackpin.context import read_sources
from stackpin.errors import BundleError
from stackpin.render import RenderRequest, render
from stackpin.target import Layout

DOCKERFILE = f"dockerfiles/{CPU_CELL}-stable.Dockerfile"


def _own_templates(root: Path) -> Path:
    """Replace the project's templates link with a copy the test may edit."""
    link = root / "templates"
    source = link.resolve()
    link.unlink()
    shutil.copytree(source, link)
    return link


def test_bundled_dockerfile_is_the_one_that_built_the_image_after_a_template_change(
    tmp_path, shipped_cells
):
    root = project(tmp_path)
    templates = _own_templates(root)
    engine = engine_with_cpu(shipped_cells)
    selection = cpu_selection(shipped_cells)
    built_with = cpu_dockerfile(selection)
    record_cpu_build(root, engine, selection)
    # The templates change after the build: a re-render would now differ.
    guard = templates / "fragments" / "guard.j2"
    guard.write_text(guard.read_text() + "# a later template change\n")
    today = render(RenderRequest(cell=selection.cell, variant="stable", lock=selection.lock,
                                 sources=read_sources(templates), stackpin_version="0.1.0")).dockerfile
    assert today != built_with
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine)
    bundled = (result.out_dir / DOCKERFILE).read_bytes()
    assert bundled == built_with.encode()
    statement = json.loads((result.out_dir / f"provenance/{CPU_CELL}.intoto.json").read_bytes())
    digests = [d.get("digest") for d in statement["predicate"]["buildDefinition"]
               ["resolvedDependencies"]]
    assert {"sha256": hashlib.sha256(built_with.encode()).hexdigest()} in digests
    assert {"sha256": hashlib.sha256(today.encode()).hexdigest()} not in digests


def test_export_without_a_build_record_refuses_in_one_line(tmp_path, shipped_cells):
    root = project(tmp_path)
    Layout(root).record_path(CPU_CELL, "stable").parent.mkdir(parents=True)
    Layout(root).record_path(CPU_CELL, "stable").write_text("{}")  # a record of nothing
    with pytest.raises(BundleError, match="no build record with its Dockerfile") as info:
        export_cpu(tmp_path, shipped_cells)
    assert "\n" not in info.value.message
    assert f"stackpin build {CPU_CELL} --variant stable" in info.value.message
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_export_refuses_a_record_of_another_image(tmp_path, shipped_cells):
    root = project(tmp_path)
    engine = engine_with_cpu(shipped_cells)
    record_cpu_build(root, engine, cpu_selection(shipped_cells))
    path = Layout(root).record_path(CPU_CELL, "stable")
    data = json.loads(path.read_text())
    data["image_id"] = "sha256:" + "0" * 64  # an earlier build of the same tag
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"the build record names image sha256:000000000000"):
        export_cpu(tmp_path, shipped_cells, engine=engine)


def test_export_refuses_a_recorded_dockerfile_that_was_edited(tmp_path, shipped_cells):
    root = project(tmp_path)
    engine = engine_with_cpu(shipped_cells)
    record_cpu_build(root, engine, cpu_selection(shipped_cells))
    kept = Layout(root).dockerfile_record_path(CPU_CELL, "stable")
    kept.write_text(kept.read_text().replace("pip check", "true"))
    with pytest.raises(BundleError, match="is not the Dockerfile that built"):
        export_cpu(tmp_path, shipped_cells, engine=engine)


def test_export_refuses_a_record_whose_dockerfile_the_image_does_not_carry(tmp_path,
                                                                          shipped_cells):
    # Record and its file agree, but the image's label names another Dockerfile.
    root = project(tmp_path)
    engine = engine_with_cpu(shipped_cells)
    record_cpu_build(root, engine, cpu_selection(shipped_cells), dockerfile="FROM other\n")
    with pytest.raises(BundleError, match="is not the Dockerfile that built"):
        export_cpu(tmp_path, shipped_cells, engine=engine)


def test_only_the_reports_made_in_the_bundled_image_travel(tmp_path, shipped_cells):
    root = project(tmp_path)
    engine = engine_with_cpu(shipped_cells)
    image_id = record_cpu_build(root, engine, cpu_selection(shipped_cells))
    reports = Layout(root).reports
    other = reports / "dtk2604-k100-torch290-py310-enhanced"  # another cell's report
    other.mkdir(parents=True)
    (other / "report.json").write_text("{}")
    (reports / "loose.json").write_text("{}")
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine)
    shipped = sorted(p.relative_to(result.out_dir).as_posix()
                     for p in (result.out_dir / "reports").rglob("*") if p.is_file())
    assert shipped == [f"reports/{CPU_CELL}-stable/report.json",
                       f"reports/{CPU_CELL}-stable/verified.json"]
    verified = json.loads((result.out_dir / shipped[1]).read_text())
    assert verified["image_id"] == image_id == result.images[0].id


def test_reports_of_an_earlier_build_stay_behind(tmp_path, shipped_cells):
    root = project(tmp_path)
    engine = engine_with_cpu(shipped_cells)
    record_cpu_build(root, engine, cpu_selection(shipped_cells))
    verified = Layout(root).verified_path(CPU_CELL, "stable")
    data = json.loads(verified.read_text())
    data["image_id"] = "sha256:" + "1" * 64  # verified before the last rebuild
    verified.write_text(json.dumps(data))
    result, _ = export_cpu(tmp_path, shipped_cells, engine=engine)
    assert not (result.out_dir / "reports").exists()
