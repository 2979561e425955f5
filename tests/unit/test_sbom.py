"""CycloneDX SBOMs from the image's own package inventory, validated against the schema."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stackpin import sbom
from stackpin.errors import BundleError

SUBJECT = sbom.Subject(image_id="sha256:" + "ab" * 32, tag="stackpin/cpu:stable-0123456789ab",
                       created="2025-01-01T00:00:00Z")
INVENTORY = sbom.Inventory(
    os_id="ubuntu", os_version="22.04", python="3.10.12",
    debs=(("libc6", "2.35-0ubuntu3.8", "amd64"), ("tzdata", "2024a-0ubuntu0.22.04", "all")),
    dists=(
        sbom.Dist(name="torch", version="2.9.0+das.opt1.dtk2604", licence_kind="expression",
                  licence="BSD-3-Clause"),
        sbom.Dist(name="flash_attn", version="2.8.3", licence_kind="name", licence="BSD License"),
        sbom.Dist(name="Jinja2", version="3.1.4"),
        sbom.Dist(name="unsloth", version="2026.10.9", licence_kind="expression",
                  licence="Apache-2.0"),
        sbom.Dist(name="trl", version="0.23.1", licence_kind="expression",
                  licence="Apache-2.0 OR MIT"),
    ),
    notices=(sbom.Notice(source=sbom.NOTICES[0], text="GNU AFFERO GENERAL PUBLIC LICENSE"),),
)


def _doc(inventory: sbom.Inventory = INVENTORY, subject: sbom.Subject = SUBJECT) -> dict:
    return json.loads(sbom.sbom_bytes(sbom.cyclonedx(inventory, subject)))


def _by_name(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["components"]}


def test_the_document_is_valid_cyclonedx_1_6_with_purls():
    data = sbom.sbom_bytes(sbom.cyclonedx(INVENTORY, SUBJECT))
    assert sbom.schema_errors(data) is None
    doc = json.loads(data)
    assert (doc["bomFormat"], doc["specVersion"], doc["version"]) == ("CycloneDX", "1.6", 1)
    assert doc["metadata"]["timestamp"] == "2025-01-01T00:00:00+00:00"
    assert doc["metadata"]["component"]["type"] == "container"
    assert doc["metadata"]["component"]["version"] == "stable-0123456789ab"
    purls = [c["purl"] for c in doc["components"]]
    assert "pkg:pypi/torch@2.9.0%2Bdas.opt1.dtk2604" in purls
    assert "pkg:pypi/flash-attn@2.8.3" in purls
    assert "pkg:pypi/jinja2@3.1.4" in purls
    assert "pkg:deb/ubuntu/libc6@2.35-0ubuntu3.8?arch=amd64" in purls
    assert len(doc["components"]) == len(INVENTORY.debs) + len(INVENTORY.dists) + 1


def test_the_schema_check_can_fail():
    # What a broken writer would produce: an unknown component type, a missing version key.
    doc = _doc()
    doc["components"][0]["type"] = "wheel"
    assert "wheel" in str(sbom.schema_errors(json.dumps(doc).encode()))
    doc = _doc()
    del doc["specVersion"]
    assert sbom.schema_errors(json.dumps(doc).encode()) is not None


def test_declared_licences_are_recorded_spdx_when_they_are_spdx():
    components = _by_name(_doc())
    assert components["torch"]["licenses"] == [{"license": {"id": "BSD-3-Clause"}}]
    assert components["trl"]["licenses"] == [{"expression": "Apache-2.0 OR MIT"}]
    assert components["flash_attn"]["licenses"] == [{"license": {"name": "BSD License"}}]
    assert "licenses" not in components["Jinja2"]  # nothing declared: nothing invented


def test_studio_is_its_own_agpl_component_inside_the_apache_unsloth_wheel():
    components = _by_name(_doc())
    studio = components["unsloth-studio"]
    assert studio["licenses"] == [{"expression": "AGPL-3.0-only"}]
    assert studio["purl"] == "pkg:pypi/unsloth@2026.10.9#studio"
    assert {"name": "io.stackpin:notice",
            "value": "licenses/unsloth-studio/LICENSE.AGPL-3.0"} in studio["properties"]
    assert components["unsloth"]["licenses"] == [{"license": {"id": "Apache-2.0"}}]
    root = next(d for d in _doc()["dependencies"] if d["ref"] == SUBJECT.image_id)
    assert studio["bom-ref"] in root["dependsOn"]


def test_the_document_is_a_pure_function_of_the_image():
    first = sbom.sbom_bytes(sbom.cyclonedx(INVENTORY, SUBJECT))
    assert first == sbom.sbom_bytes(sbom.cyclonedx(INVENTORY, SUBJECT))
    serial = json.loads(first)["serialNumber"]
    assert serial.startswith("urn:uuid:")
    other = sbom.Subject(image_id="sha256:" + "cd" * 32, tag=SUBJECT.tag, created=SUBJECT.created)
    assert _doc(subject=other)["serialNumber"] != serial


def test_the_probe_runs_offline_with_the_images_interpreter():
    request = sbom.probe_request("sha256:" + "ab" * 32)
    assert request.entrypoint == ("/opt/stackpin/venv/bin/python",)
    assert request.network_mode == "none"


def test_the_probe_script_runs_and_its_output_parses():
    # The same script the container runs, here with this interpreter (dpkg may be absent).
    out = subprocess.run([sys.executable, "-c", sbom.PROBE], capture_output=True, text=True,
                         check=True).stdout
    inventory = sbom.parse_probe(out, image="host")
    names = {d.name.lower(): d for d in inventory.dists}
    assert "pytest" in names
    assert names["pytest"].licence  # pytest declares MIT: the probe reads licences
    assert inventory.python == ".".join(map(str, sys.version_info[:3]))
    assert sbom.schema_errors(sbom.sbom_bytes(sbom.cyclonedx(inventory, SUBJECT))) is None


def test_the_probe_finds_the_notice_file_of_an_installed_distribution(tmp_path):
    # A fake 'unsloth' distribution with studio/LICENSE.AGPL-3.0, found like the real one.
    site = tmp_path / "site"
    (site / "studio").mkdir(parents=True)
    (site / "studio" / "LICENSE.AGPL-3.0").write_text("AGPL TEXT\n")
    info = site / "unsloth-2026.10.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.4\nName: unsloth\nVersion: 2026.10.9\nLicense-Expression: Apache-2.0\n")
    out = subprocess.run([sys.executable, "-c", sbom.PROBE], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": str(site)}).stdout
    (notice,) = sbom.parse_probe(out, image="host").notices
    assert (notice.text, notice.bundle_path) == (
        "AGPL TEXT\n", "licenses/unsloth-studio/LICENSE.AGPL-3.0")


def test_garbage_from_the_probe_is_a_bundle_error():
    with pytest.raises(BundleError, match="export only images built by `stackpin build`"):
        sbom.parse_probe("exec: no such file\n", image="x")


def test_no_command_pays_for_the_schema_validator_until_a_document_is_validated():
    # jsonschema's format checkers build a grammar when imported (seconds of CPU): a
    # top-level import would charge it to every command, `bundle load` included.
    heavy = ("jsonschema", "cyclonedx.validation.json", "rfc3987_syntax")
    probe = ("import sys, stackpin.cli.main; from stackpin import sbom; "
             f"print([m for m in {heavy!r} if m in sys.modules]); "
             "sbom.schema_errors(b'{}'); "
             f"print([m for m in {heavy!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    before, after = done.stdout.splitlines()
    assert before == "[]"
    assert after == str(list(heavy))  # the probe sees the validator once it is used
