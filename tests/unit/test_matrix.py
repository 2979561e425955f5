"""The matrix loader: types, unknown keys, structural rules, schema, shipped files."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import tomllib

from stackpin.errors import ConfigurationError
from stackpin.matrix import Variant, cell_json, json_schema, reference_rows
from stackpin.matrixfile import decode_matrix, decode_matrix_lenient, find_cell, load_cells

MINIMAL = """
schema_version = 1
[cells.c1]
platform = "cpu"
python = "cp311"
glibc = "2.36"
numpy = "<2"
[cells.c1.base.bootstrap]
suite = "bookworm"
mirror = "http://deb.debian.org/debian"
[cells.c1.torch]
filename = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
source = "index"
[cells.c1.stack]
numpy = "1.26.4"
"""


def decode(text: str):
    return decode_matrix(tomllib.loads(text), source="t.toml")


def problems_of(text: str) -> list[str]:
    _, problems = decode_matrix_lenient(tomllib.loads(text))
    return [str(p) for p in problems]


def test_minimal_cell_decodes_with_defaults():
    cell = decode(MINIMAL).cells["c1"]
    assert cell.id == "c1"
    assert cell.variants == ("stable",)
    assert cell.cpu_arch == "x86_64"
    assert cell.attention is None
    assert dict(cell.stack) == {"numpy": "1.26.4"}
    assert cell.base.bootstrap is not None
    assert cell.base.bootstrap.mmdebstrap_variant == "minbase"


def test_cells_are_frozen():
    cell = decode(MINIMAL).cells["c1"]
    with pytest.raises(AttributeError):
        cell.python = "cp310"  # type: ignore[misc]


def test_unknown_key_gets_did_you_mean():
    found = problems_of(MINIMAL.replace('numpy = "<2"', 'nupmy = "<2"\nnumpy = "<2"'))
    assert found == ["cells.c1.nupmy: unknown key (perhaps you meant 'numpy'?)"]


def test_unknown_key_does_not_hide_the_rest_of_the_cell():
    matrix, found = decode_matrix_lenient(tomllib.loads(MINIMAL.replace("glibc", "glibcc")))
    assert any("glibcc: unknown key (perhaps you meant 'glibc'?)" in str(p) for p in found)
    assert any(str(p) == "cells.c1.glibc: required key is missing" for p in found)
    assert matrix is None


def test_wrong_types_are_reported_with_path():
    found = problems_of(MINIMAL.replace('python = "cp311"', "python = 311"))
    assert found == ["cells.c1.python: expected a string, found integer"]


def test_boolean_is_not_an_integer():
    text = MINIMAL.replace('platform = "cpu"', 'platform = "cpu"\nsource_date_epoch = true')
    assert problems_of(text) == ["cells.c1.source_date_epoch: expected an integer, found boolean"]


def test_literal_choices_suggest_the_closest():
    found = problems_of(MINIMAL.replace('platform = "cpu"', 'platform = "dkt"'))
    assert found == ["cells.c1.platform: 'dkt' is not one of dtk, rocm, cuda, cpu (perhaps you meant 'dtk'?)"]


def test_variants_decode_to_the_enum_and_keep_their_spelling():
    cell = decode(MINIMAL.replace('glibc = "2.36"', 'glibc = "2.36"\nvariants = ["stable", "enhanced"]')).cells["c1"]
    assert cell.variants == (Variant.STABLE, Variant.ENHANCED)
    assert all(type(v) is Variant for v in cell.variants)
    # Tags, paths and labels spell a variant as its value; maps keyed by the string find it.
    assert f"{cell.id}:{cell.variants[1]}" == "c1:enhanced" and str(Variant.STABLE) == "stable"
    assert {"stable": 1}[Variant.STABLE] == 1
    assert json.loads(cell_json(cell))["variants"] == ["stable", "enhanced"]


def test_an_unknown_variant_is_refused_with_the_closest():
    found = problems_of(MINIMAL.replace('glibc = "2.36"', 'glibc = "2.36"\nvariants = ["stabel"]'))
    assert found == ["cells.c1.variants[0]: 'stabel' is not one of stable, enhanced (perhaps you meant 'stable'?)"]


def test_schema_and_reference_spell_the_variant_choices():
    cell_schema = json_schema()["properties"]["cells"]["additionalProperties"]
    assert cell_schema["properties"]["variants"]["items"]["enum"] == ["stable", "enhanced"]
    assert cell_schema["properties"]["variants"]["default"] == ["stable"]
    row = next(r for r in reference_rows() if r[0] == "cells.<id>.variants")
    assert row[1:3] == ("array of 'stable' or 'enhanced'", "('stable',)")


def test_every_problem_of_a_file_is_reported_together():
    text = MINIMAL.replace('python = "cp311"', "python = 3").replace('glibc = "2.36"', 'glibc = "2.36"\ncolour = 1')
    with pytest.raises(ConfigurationError) as info:
        decode(text)
    assert len(info.value.details) == 2
    assert "2 problem(s)" in info.value.message


def test_base_needs_exactly_one_source():
    text = MINIMAL.replace("[cells.c1.base.bootstrap]", '[cells.c1.base]\nimage = "x:y"\n[cells.c1.base.bootstrap]')
    assert problems_of(text) == ["cells.c1.base: set exactly one of 'image' or 'bootstrap'"]


def test_malformed_digest_and_sha_are_reported():
    text = MINIMAL.replace('source = "index"', 'source = "index"\nsha256 = "abc"')
    assert problems_of(text) == ["cells.c1.torch.sha256: expected 64 hex digits"]


def test_cell_id_pattern():
    text = MINIMAL.replace("cells.c1", "cells.C_1")
    assert "a cell id is 1-64 lower-case letters" in problems_of(text)[0]


def test_schema_version_is_checked():
    assert problems_of(MINIMAL.replace("schema_version = 1", "schema_version = 2")) == [
        "schema_version: this stackpin reads version 1"
    ]


def test_bad_toml_names_the_file(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[cells\n")
    with pytest.raises(ConfigurationError, match=r"bad\.toml: not valid TOML"):
        load_cells([bad])


def test_duplicate_cell_ids_across_files(tmp_path: Path):
    for name in ("a.toml", "b.toml"):
        (tmp_path / name).write_text(MINIMAL)
    with pytest.raises(ConfigurationError,
                       match=r"b\.toml: cells\.c1: the id is also declared in .*a\.toml"):
        load_cells([tmp_path / "a.toml", tmp_path / "b.toml"])


def test_find_cell_suggests(shipped_cells):
    with pytest.raises(ConfigurationError, match=r"perhaps you meant 'dtk2604-k100-torch290-py310'\?"):
        find_cell(shipped_cells, "dtk2604-k100-torch290-py31")


def test_cell_json_is_canonical_and_stable():
    a = decode(MINIMAL).cells["c1"]
    b = decode(MINIMAL).cells["c1"]
    assert cell_json(a) == cell_json(b)
    assert " " not in cell_json(a)
    assert json.loads(cell_json(a))["torch"]["source"] == "index"


def test_schema_rejects_what_the_loader_rejects():
    schema = json_schema()
    data = tomllib.loads(MINIMAL)
    jsonschema.validate(data, schema)
    data["cells"]["c1"]["nupmy"] = "<2"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "pinning").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_matrix_validates_against_the_schema(path: Path):
    jsonschema.validate(tomllib.loads(path.read_text()), json_schema())
    assert decode_matrix(tomllib.loads(path.read_text()), source=str(path)).cells


def test_shipped_cells_cover_the_platform_facts(shipped_cells):
    k100 = shipped_cells["dtk2604-k100-torch290-py310"]
    assert k100.arch == ("gfx928",) and k100.python == "cp310"
    assert k100.attention is not None and "torch290" in k100.attention.filename
    bw = shipped_cells["dtk2604-bw-torch2100-py310"]
    assert bw.arch == ("gfx936",)
    assert {w.filename.split("-")[0] for w in bw.vendor_wheels} == {"triton", "vllm"}
    assert shipped_cells["dtk2404-torch210-py310"].variants == ("stable",)
    cpu = shipped_cells["cpu-bookworm-torch2130-py311"]
    assert cpu.variants == ("stable",) and cpu.base.bootstrap is not None
    assert {c.platform for c in shipped_cells.values()} == {"cpu", "cuda", "rocm", "dtk"}


def test_reference_rows_cover_every_setting():
    keys = [row[0] for row in reference_rows()]
    assert "cells.<id>.torch.sha256" in keys
    assert "cells.<id>.base.bootstrap.suite" in keys
    assert all(row[3] for row in reference_rows()), "every setting has a help text"


def test_missing_required_key_beside_optional_ones_is_a_problem_not_a_crash():
    text = MINIMAL.replace('numpy = "<2"\n', 'description = "x"\nsource_date_epoch = 1\n', 1)
    assert problems_of(text) == ["cells.c1.numpy: required key is missing"]
