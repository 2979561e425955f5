"""Rendering: golden Dockerfiles for every shipped cell x variant, and what they must hold."""

from __future__ import annotations

import json
import os

import pytest
from tests.conftest import CPU_CELL, K100_CELL, ROOT

from stackpin.errors import ConfigurationError
from stackpin.lock import read_lock
from stackpin.matrix import Cell
from stackpin.render import (
    RenderRequest,
    base_reference,
    dockerfile_quote,
    render,
)

GOLDEN = ROOT / "tests" / "golden"
UPDATE = os.environ.get("STACKPIN_UPDATE_GOLDEN") == "1"


def _render(cell: Cell, variant: str, *, with_lock: bool = True):
    return render(
        RenderRequest(
            cell=cell,
            variant=variant,  # type: ignore[arg-type]
            lock=read_lock(ROOT, cell.id) if with_lock else None,
            templates_dir=ROOT / "templates",
            stackpin_version="0.1.0",
        )
    )


def _cases():
    from stackpin.matrix import load_cells

    cells = load_cells(sorted((ROOT / "pinning").glob("*.toml")))
    return [(c, v) for c in cells.values() for v in c.variants]


@pytest.mark.parametrize(("cell", "variant"), _cases(), ids=lambda x: getattr(x, "id", x))
def test_golden_dockerfile(cell: Cell, variant: str):
    golden = GOLDEN / f"{cell.id}-{variant}.Dockerfile"
    text = _render(cell, variant).dockerfile
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"no golden file; run STACKPIN_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == golden.read_text()


def test_render_is_byte_identical_across_calls(shipped_cells):
    first = _render(shipped_cells[K100_CELL], "enhanced")
    second = _render(shipped_cells[K100_CELL], "enhanced")
    assert first.files == second.files


def test_dtk_enhanced_holds_no_deps_env_sourcing_guard(shipped_cells):
    text = _render(shipped_cells[K100_CELL], "enhanced").dockerfile
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    assert runs and all(line.startswith("RUN source /opt/dtk/env.sh && ") for line in runs)
    assert text.count("pip install --no-index --no-deps --require-hashes") == 3
    assert "guard.py" in text and "--torch 2.9.0+das.opt1.dtk2604" in text
    assert "--numpy '<2'" in text
    assert "pip check" in text


def test_final_stage_copies_only_the_environment(shipped_cells):
    text = _render(shipped_cells[K100_CELL], "enhanced").dockerfile
    final = text.split("# ---- final stage")[1].split("\n", 1)[1]
    copies = [line for line in final.splitlines() if line.startswith("COPY")]
    assert copies == [
        "COPY --from=install /opt/stackpin /opt/stackpin",
        "COPY verify/ /opt/stackpin/verify/",
    ]
    assert [line.split()[0] for line in final.splitlines() if line and not line.startswith(("#", " "))] == [
        "FROM", "COPY", "COPY", "ENV", "LABEL", "ENTRYPOINT", "CMD",
    ]


def test_stable_variant_has_no_attention_layer(shipped_cells):
    text = _render(shipped_cells[K100_CELL], "stable").dockerfile
    assert "wheels/attention" not in text
    assert "STACKPIN_ATTENTION=sdpa" in text


def test_enhanced_adds_attention_layer_last(shipped_cells):
    rendered = _render(shipped_cells[K100_CELL], "enhanced")
    text = rendered.dockerfile
    assert text.index("wheels/vendor/") < text.index("wheels/stack/") < text.index("wheels/attention/")
    assert "wheels/attention/requirements.txt" in rendered.files


def test_entrypoint_sources_dtk_env(shipped_cells):
    entry = _render(shipped_cells[K100_CELL], "stable").files["stackpin/entrypoint.sh"]
    assert "source /opt/dtk/env.sh" in entry and entry.rstrip().endswith('exec "$@"')
    cpu_entry = _render(shipped_cells[CPU_CELL], "stable").files["stackpin/entrypoint.sh"]
    assert "source" not in cpu_entry


def test_labels_carry_cell_variant_lock_and_cell_json(shipped_cells):
    cell = shipped_cells[CPU_CELL]
    rendered = _render(cell, "stable")
    lock = read_lock(ROOT, cell.id)
    assert lock is not None
    labels = rendered.labels
    assert labels["io.stackpin.cell"] == CPU_CELL
    assert labels["io.stackpin.variant"] == "stable"
    assert labels["io.stackpin.lock-digest"] == lock.digest
    assert json.loads(labels["io.stackpin.cell-json"])["id"] == CPU_CELL
    assert labels["org.opencontainers.image.created"] == "2025-01-01T00:00:00Z"


def test_requirements_are_hash_locked_per_layer(shipped_cells):
    cell = shipped_cells[CPU_CELL]
    rendered = _render(cell, "stable")
    vendor = rendered.files["wheels/vendor/requirements.txt"].splitlines()[1:]
    assert vendor == [f"torch==2.13.0+cpu --hash=sha256:{cell.torch.sha256}"]
    stack = rendered.files["wheels/stack/requirements.txt"].splitlines()[1:]
    assert any(line.startswith("transformers==5.17.0 --hash=sha256:") for line in stack)
    assert all(" --hash=sha256:" in line for line in stack)


def test_image_json_records_pins(shipped_cells):
    info = json.loads(_render(shipped_cells[CPU_CELL], "stable").files["stackpin/image.json"])
    assert info["torch"] == "2.13.0+cpu"
    assert info["pins"]["numpy"] == "1.26.4"
    assert info["attention"] == "sdpa"
    assert info["bitsandbytes"] == "disabled"


def test_unknown_variant_is_refused(shipped_cells):
    with pytest.raises(ConfigurationError, match="builds stable, not 'enhanced'"):
        _render(shipped_cells[CPU_CELL], "enhanced")


def test_base_reference_pins_digest_and_bootstrap_tag(shipped_cells):
    import dataclasses

    k100 = shipped_cells[K100_CELL]
    digest = "sha256:" + "a" * 64
    pinned = dataclasses.replace(k100, base=dataclasses.replace(k100.base, digest=digest))
    assert base_reference(pinned) == k100.base.image
    assert image_labels_of(pinned)["org.opencontainers.image.base.digest"] == digest
    assert base_reference(shipped_cells[CPU_CELL]).startswith("stackpin/base-bookworm:")


def image_labels_of(cell):
    from stackpin.render import image_labels

    return image_labels(
        RenderRequest(cell=cell, variant="stable", lock=None, templates_dir=ROOT / "templates",
                      stackpin_version="0.1.0")
    )


def test_dockerfile_quote_escapes():
    assert dockerfile_quote('a"b$c\\d') == '"a\\"b\\$c\\\\d"'
