"""CycloneDX SBOMs from the image's own package inventory."""

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
    dists=(("torch", "2.9.0+das.opt1.dtk2604"), ("flash_attn", "2.8.3"), ("Jinja2", "3.1.4")),
)


def test_the_document_is_cyclonedx_1_5_with_purls():
    doc = sbom.cyclonedx(INVENTORY, SUBJECT)
    assert (doc["bomFormat"], doc["specVersion"], doc["version"]) == ("CycloneDX", "1.5", 1)
    assert doc["metadata"]["timestamp"] == "2025-01-01T00:00:00Z"
    assert doc["metadata"]["component"]["type"] == "container"
    assert doc["metadata"]["component"]["version"] == "stable-0123456789ab"
    purls = [c["purl"] for c in doc["components"]]
    assert purls == sorted(purls)
    assert "pkg:pypi/torch@2.9.0%2Bdas.opt1.dtk2604" in purls
    assert "pkg:pypi/flash-attn@2.8.3" in purls
    assert "pkg:pypi/jinja2@3.1.4" in purls
    assert "pkg:deb/ubuntu/libc6@2.35-0ubuntu3.8?arch=amd64" in purls
    assert {c["version"] for c in doc["components"]} >= {"2.9.0+das.opt1.dtk2604", "2.35-0ubuntu3.8"}


def test_the_document_is_a_pure_function_of_the_image():
    first = sbom.sbom_bytes(sbom.cyclonedx(INVENTORY, SUBJECT))
    assert first == sbom.sbom_bytes(sbom.cyclonedx(INVENTORY, SUBJECT))
    serial = json.loads(first)["serialNumber"]
    assert serial.startswith("urn:uuid:")
    other = sbom.Subject(image_id="sha256:" + "cd" * 32, tag=SUBJECT.tag, created=SUBJECT.created)
    assert json.loads(sbom.sbom_bytes(sbom.cyclonedx(INVENTORY, other)))["serialNumber"] != serial


def test_the_probe_runs_offline_with_the_images_interpreter():
    request = sbom.probe_request("sha256:" + "ab" * 32)
    assert request.entrypoint == ("/opt/stackpin/venv/bin/python",)
    assert request.network_mode == "none"


def test_the_probe_script_runs_and_its_output_parses():
    # The same script the container runs, here with this interpreter (dpkg may be absent).
    out = subprocess.run([sys.executable, "-c", sbom.PROBE], capture_output=True, text=True,
                         check=True).stdout
    inventory = sbom.parse_probe(out, image="host")
    assert any(name.lower() == "pytest" for name, _ in inventory.dists)
    assert inventory.python == ".".join(map(str, sys.version_info[:3]))


def test_garbage_from_the_probe_is_a_bundle_error():
    with pytest.raises(BundleError, match="export only images built by `stackpin build`"):
        sbom.parse_probe("exec: no such file\n", image="x")
