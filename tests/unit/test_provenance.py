"""The in-toto / SLSA v1 provenance statement, from the CPU default's real lock."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL

from stackpin import __version__
from stackpin.context import read_sources
from stackpin.errors import ValidationError
from stackpin.lock import Lock, read_lock
from stackpin.matrix import Cell
from stackpin.provenance import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    ImageSubject,
    ProvenanceInputs,
    provenance_statement,
    statement_bytes,
)
from stackpin.render import RenderRequest, image_tags, render

BASE_ID = "sha256:" + "4280951b9e1619e13c6fd2f454e5e73c35cddddae171ad2517ecfaaaa562a24e"
IMAGE_ID = "sha256:" + "b5a05a4be859c0dd8dea1728e812fcd80ff95bd1605b35adbdc01a3b5691d67b"
COMMIT = "fdb99b6" + "0" * 33


@pytest.fixture
def lock(root: Path) -> Lock:
    found = read_lock(root, CPU_CELL)
    assert found is not None
    return found


@pytest.fixture
def dockerfile(root: Path, shipped_cells: dict[str, Cell], lock: Lock) -> str:
    return render(RenderRequest(cell=shipped_cells[CPU_CELL], variant="stable", lock=lock,
                                sources=read_sources(root / "templates"),
                                stackpin_version=__version__)).dockerfile


def inputs(lock: Lock, dockerfile: str, commit: str = COMMIT) -> ProvenanceInputs:
    return ProvenanceInputs(lock=lock, base_reference="stackpin/base-bookworm:eff575722d7d",
                            base_image_id=BASE_ID, dockerfiles={"stable": dockerfile},
                            stackpin_version=__version__, source_commit=commit)


def subjects(shipped_cells: dict[str, Cell], lock: Lock) -> list[ImageSubject]:
    tags = image_tags(shipped_cells[CPU_CELL], "stable", lock.digest)
    return [ImageSubject(name=t, image_id=IMAGE_ID) for t in tags]


def test_statement_is_in_toto_v1_with_slsa_v1_provenance(lock, dockerfile, shipped_cells):
    statement = provenance_statement(inputs(lock, dockerfile), subjects(shipped_cells, lock))
    assert statement["_type"] == STATEMENT_TYPE == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE == "https://slsa.dev/provenance/v1"
    assert {s["digest"]["sha256"] for s in statement["subject"]} == {IMAGE_ID[7:]}
    assert [s["name"] for s in statement["subject"]] == sorted(
        image_tags(shipped_cells[CPU_CELL], "stable", lock.digest))
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"] == {
        "cell": CPU_CELL, "variants": ["stable"], "lockDigest": lock.digest}
    assert definition["internalParameters"]["sourceDateEpoch"] == lock.source_date_epoch
    assert statement["predicate"]["runDetails"]["builder"]["version"] == {"stackpin": __version__}


def test_every_input_is_named_with_its_digest(lock, dockerfile, shipped_cells):
    statement = provenance_statement(inputs(lock, dockerfile), subjects(shipped_cells, lock))
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    by_name = {d["name"]: d for d in deps}
    assert by_name["base-image"]["digest"] == {"sha256": BASE_ID[7:]}
    assert by_name["Dockerfile (stable)"]["digest"] == {
        "sha256": hashlib.sha256(dockerfile.encode()).hexdigest()}
    assert by_name[f"pinning/locks/{CPU_CELL}.lock"]["digest"] == {"sha256": lock.digest}
    for wheel in lock.wheels:
        assert by_name[wheel.filename]["digest"] == {"sha256": wheel.sha256}
        assert by_name[wheel.filename]["annotations"]["group"] == wheel.group
    torch = next(w for w in lock.wheels if w.name == "torch")
    assert by_name[torch.filename]["uri"].startswith("pkg:pypi/torch@2.13.0%2Bcpu?file_name=")
    assert by_name["stackpin-source"]["digest"] == {"gitCommit": COMMIT}
    assert len(deps) == len(lock.wheels) + 4


def test_same_inputs_give_the_same_bytes_whatever_the_subject_order(lock, dockerfile, shipped_cells):
    listed = subjects(shipped_cells, lock)
    first = statement_bytes(provenance_statement(inputs(lock, dockerfile), listed))
    second = statement_bytes(provenance_statement(inputs(lock, dockerfile), listed[::-1]))
    assert first == second
    assert first.endswith(b"\n")
    assert json.loads(first)["_type"] == STATEMENT_TYPE


def test_a_dirty_or_unknown_checkout_is_recorded_as_such(lock, dockerfile, shipped_cells):
    dirty = provenance_statement(inputs(lock, dockerfile, COMMIT + "+dirty"),
                                 subjects(shipped_cells, lock))
    source = dirty["predicate"]["buildDefinition"]["resolvedDependencies"][-1]
    assert source == {"name": "stackpin-source", "digest": {"gitCommit": COMMIT},
                      "annotations": {"dirty": True}}
    unknown = provenance_statement(inputs(lock, dockerfile, "unknown"),
                                   subjects(shipped_cells, lock))
    source = unknown["predicate"]["buildDefinition"]["resolvedDependencies"][-1]
    assert source == {"name": "stackpin-source", "annotations": {"commit": "unknown"}}


def test_a_vendor_wheel_is_a_file_input(lock, dockerfile, shipped_cells):
    vendor = replace(lock.wheels[0], source="vendor", filename="torch-2.9.0+das.dtk2604-cp310-cp310-manylinux_2_28_x86_64.whl")
    statement = provenance_statement(inputs(replace(lock, wheels=(vendor,)), dockerfile),
                                     subjects(shipped_cells, lock))
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert deps[3]["uri"] == "file:wheels/vendor/torch-2.9.0%2Bdas.dtk2604-cp310-cp310-manylinux_2_28_x86_64.whl"


def test_bad_digests_and_no_images_are_refused(lock, dockerfile, shipped_cells):
    with pytest.raises(ValidationError, match="not a sha256 digest"):
        provenance_statement(inputs(lock, dockerfile), [ImageSubject(name="x", image_id="abc")])
    with pytest.raises(ValidationError, match="at least one image"):
        provenance_statement(inputs(lock, dockerfile), [])
