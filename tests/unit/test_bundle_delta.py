"""Delta bundles (issue 25): the site's inventory, an export that leaves out what the site
holds, and the site scripts that refuse a delta whose base layers are absent.

The bash side runs for real against a fake engine CLI (a shim first on PATH) that answers
`image ls`/`image inspect` with the layers a site holds: the chain IDs bash computes for
inventory.sh must be those Python computes for the export (one rule, two languages).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from test_bundle_fakes import (
    PROBE_OUTPUT,
    cpu_dockerfile,
    cpu_selection,
    export_cpu,
    image_config,
    layer_bytes,
    unzstd,
)
from tests.fake_engine import FakeEngine
from tests.tools import need_tool

from stackpin.build import sha256_text
from stackpin.bundle import delta
from stackpin.bundle.delta import chain_ids, omitted_blobs, parse_inventory
from stackpin.errors import BundleError
from stackpin.render import base_reference, image_tags
from stackpin.target import LABEL_DOCKERFILE_SHA256

D1, D2, D3 = (f"sha256:{hashlib.sha256(s.encode()).hexdigest()}" for s in ("a", "b", "c"))


def inventory_text(*pairs: tuple[str, str], notes: str = "engine docker 28.5.2\n") -> bytes:
    body = "stackpin-inventory 1\n" + notes
    body += "".join(f"layer {chain} {diff}\n" for chain, diff in pairs)
    return (body + f"sha256 {hashlib.sha256(body.encode()).hexdigest()}\n").encode()


# --- the pure rules -------------------------------------------------------------------


def test_chain_ids_follow_the_oci_image_spec():
    chains = chain_ids([D1, D2, D3])
    assert chains[0] == D1  # the bottom layer's chain is its diff ID
    second = "sha256:" + hashlib.sha256(f"{D1} {D2}".encode()).hexdigest()
    assert chains[1] == second
    assert chains[2] == "sha256:" + hashlib.sha256(f"{second} {D3}".encode()).hexdigest()


def test_a_layer_is_left_out_only_where_its_whole_chain_is_held():
    held = chain_ids([D1, D2])
    assert omitted_blobs([[D1, D2, D3]], held) == {D1, D2}
    # The same content on another parent is another layer: it travels.
    assert omitted_blobs([[D2, D3]], held) == set()
    # Held for one image, needed by another: the blob travels.
    assert omitted_blobs([[D1, D2], [D3, D2]], held) == {D1}


def test_an_inventory_is_read_back_with_its_layers():
    chains = chain_ids([D1, D2])
    inventory = parse_inventory(inventory_text((chains[0], D1), (chains[1], D2)), what="inv")
    assert inventory.layers == {chains[0]: D1, chains[1]: D2}


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: d[:-20], "end with a newline"),  # cut short mid-line
    (lambda d: b"\n".join(d.split(b"\n")[:2] + d.split(b"\n")[3:]), "closing sha256"),  # a line lost
    (lambda d: d.replace(D3[7:].encode(), D1[7:].encode(), 1), "closing sha256"),  # edited
    (lambda d: d.replace(b"stackpin-inventory 1", b"stackpin-inventory 2"), "does not start"),
    (lambda d: b"\xff" + d, "not ASCII"),
    (lambda d: b"x" * (delta.MAX_INVENTORY_BYTES + 1), "larger than"),
])
def test_a_damaged_inventory_is_one_bundle_error(damage, message):
    data = damage(inventory_text((chain_ids([D3])[0], D3)))
    with pytest.raises(BundleError, match=message):
        parse_inventory(data, what="inv")


def test_an_unknown_line_is_named_even_under_a_matching_checksum():
    body = "stackpin-inventory 1\nlayer sha256:zz sha256:zz\n"
    data = (body + f"sha256 {hashlib.sha256(body.encode()).hexdigest()}\n").encode()
    with pytest.raises(BundleError, match="line 2: 'layer sha256:zz sha256:zz' is not"):
        parse_inventory(data, what="inv")


# --- export --against ----------------------------------------------------------------------


def two_layer_engine(cells) -> tuple[FakeEngine, list[bytes]]:  # type: ignore[no-untyped-def]
    """The CPU image with a lower and an upper layer (as torch and the stack are)."""
    selection = cpu_selection(cells)
    engine = FakeEngine(run_stdout=PROBE_OUTPUT + "\n")
    engine.add({"created": "2025-01-01T00:00:00Z"}, [b"base rootfs"],
               tags=(base_reference(selection.cell),))
    labels = {LABEL_DOCKERFILE_SHA256: sha256_text(cpu_dockerfile(selection))}
    layers = [layer_bytes("lower", 2 << 20), layer_bytes("upper", 1 << 20)]
    config = image_config(selection.cell, "stable", selection.lock.digest, labels=labels)
    engine.add(config, layers, tags=image_tags(selection.cell, "stable", selection.lock.digest))
    return engine, layers


def blobs_of(out: Path) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(unzstd((out / "images.tar.zst").read_bytes()))) as tar:
        return {m.name.removeprefix("blobs/sha256/") for m in tar if m.name.startswith("blobs/")}


def test_a_delta_leaves_out_the_held_layers_and_names_them(tmp_path, shipped_cells):
    engine, layers = two_layer_engine(shipped_cells)
    full, _ = export_cpu(tmp_path, shipped_cells, engine=engine, name="full")
    manifest = json.loads((full.out_dir / "manifest.json").read_bytes())
    (image,) = manifest["images"]
    diffs = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    assert {d.removeprefix("sha256:") for d in diffs} <= blobs_of(full.out_dir)
    assert image["base_layers"] == [] and manifest["delta"] is None

    inventory = parse_inventory(inventory_text((chain_ids(diffs)[0], diffs[0])), what="inv")
    part, _ = export_cpu(tmp_path, shipped_cells, engine=engine, name="delta", against=inventory)
    out = part.out_dir
    delta_manifest = json.loads((out / "manifest.json").read_bytes())
    (delta_image,) = delta_manifest["images"]
    assert diffs[0].removeprefix("sha256:") not in blobs_of(out)
    assert diffs[1].removeprefix("sha256:") in blobs_of(out)
    # The image is still named whole: the IDs are those of the full bundle.
    for key in ("id", "config_digest", "manifest_digest"):
        assert delta_image[key] == image[key]
    assert delta_image["base_layers"] == [{"chain_id": diffs[0], "diff_id": diffs[0]}]
    assert delta_manifest["delta"] == {"inventory_sha256": inventory.sha256}
    assert part.stream.tar_bytes < full.stream.tar_bytes - (2 << 20)
    conf = (out / "bin" / "bundle.conf").read_text()
    assert f"BUNDLE_BASE_CHAINS=({diffs[0]})" in conf
    assert f"BUNDLE_BASE_DIFFS=({diffs[0]})" in conf


def test_a_layer_held_on_another_parent_is_not_left_out(tmp_path, shipped_cells):
    engine, layers = two_layer_engine(shipped_cells)
    diffs = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    # The site holds the upper layer's content, but on no parent of this image.
    inventory = parse_inventory(inventory_text((diffs[1], diffs[1])), what="inv")
    part, _ = export_cpu(tmp_path, shipped_cells, engine=engine, name="delta", against=inventory)
    assert {d.removeprefix("sha256:") for d in diffs} <= blobs_of(part.out_dir)
    assert "BUNDLE_BASE_CHAINS=()" in (part.out_dir / "bin" / "bundle.conf").read_text()


# --- the site side: inventory.sh, and load.sh refusing a delta whose base is absent ---------

SHIM = """#!/bin/bash
printf '%s\\n' "$*" >> "$SHIM_LOG"
case "$1 ${2:-}" in
    "version "*) [ -z "${SHIM_DOWN:-}" ] || exit 1; echo 28.5.2 ;;
    "image ls") [ -z "$SHIM_LAYERS" ] || echo sha256:1111 ;;
    "image inspect") case "$*" in *RootFS*) tr ' ' '\\n' <<<"$SHIM_LAYERS" ;; esac ;;
    "load "*) cat > /dev/null; echo "Loaded image: x" ;;
    *) exit 0 ;;
esac
"""


@pytest.fixture
def shim(tmp_path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    for tool in ("bash", "sha256sum", "zstd", "openssl"):
        need_tool(tool)
    folder = tmp_path / "shim"
    folder.mkdir()
    (folder / "docker").write_text(SHIM)
    (folder / "docker").chmod(0o755)
    (tmp_path / "engine.log").touch()
    return {"PATH": f"{folder}:/usr/bin:/bin", "SHIM_LOG": str(tmp_path / "engine.log"),
            "SHIM_LAYERS": "", "STACKPIN_ENGINE": "docker"}


def _run(script: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_inventory_sh_writes_what_export_reads_with_the_same_chain_ids(tmp_path, shim):
    bin_dir = Path(__file__).resolve().parents[2] / "bundle" / "bin"
    out = tmp_path / "site.inventory"
    done = _run(bin_dir / "inventory.sh", "-o", str(out),
                env={**shim, "SHIM_LAYERS": f"{D1} {D2} {D3}"})
    assert done.returncode == 0, done.stderr
    assert "PASS  inventory: 3 layer(s) held by docker 28.5.2" in done.stderr
    inventory = parse_inventory(out.read_bytes(), what="inventory.sh's output")
    assert inventory.layers == dict(zip(chain_ids([D1, D2, D3]), [D1, D2, D3], strict=True))


def test_inventory_sh_refuses_an_engine_that_does_not_answer(tmp_path, shim):
    bin_dir = Path(__file__).resolve().parents[2] / "bundle" / "bin"
    done = _run(bin_dir / "inventory.sh", "-o", str(tmp_path / "x"),
                env={**shim, "SHIM_DOWN": "1", "SHIM_LAYERS": D1})
    assert done.returncode == 8
    assert "docker does not answer: start it" in done.stderr
    assert not (tmp_path / "x").exists()  # no inventory of an engine that was not asked
    done = _run(bin_dir / "inventory.sh", env={**shim, "STACKPIN_ENGINE": "dockr"})
    assert done.returncode == 2
    assert "STACKPIN_ENGINE='dockr': set it to docker or podman" in done.stderr


def test_load_sh_refuses_a_delta_whose_base_is_absent_then_loads_it_where_present(
        tmp_path, shipped_cells, shim):
    engine, layers = two_layer_engine(shipped_cells)
    diffs = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    inventory = parse_inventory(inventory_text((diffs[0], diffs[0])), what="inv")
    part, public = export_cpu(tmp_path, shipped_cells, engine=engine, against=inventory)
    env = {**shim, "STACKPIN_PUBKEY": str(public)}
    log = Path(shim["SHIM_LOG"])

    done = _run(part.out_dir / "bin" / "load.sh", env=env)  # the site holds nothing
    assert done.returncode == 7, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("FAIL  delta bundle: 1 base layer(s) absent from this docker engine:")
    assert f"{diffs[0]} (diff {diffs[0]})" in line
    assert not [c for c in log.read_text().splitlines() if c.startswith("load")]

    # Another image holding the same content on a parent is not the layer: still refused.
    done = _run(part.out_dir / "bin" / "load.sh", env={**env, "SHIM_LAYERS": f"{D1} {diffs[0]}"})
    assert done.returncode == 7

    done = _run(part.out_dir / "bin" / "load.sh", env={**env, "SHIM_LAYERS": diffs[0]})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS  delta: the 1 layer(s) this bundle left out are present" in done.stdout
    assert [c for c in log.read_text().splitlines() if c.startswith("load")] == ["load"]


def test_bundle_load_refuses_a_delta_whose_base_this_engine_lacks(tmp_path, shipped_cells):
    from test_bundle_fakes import site_trusting

    from stackpin.bundle import load as loading

    engine, layers = two_layer_engine(shipped_cells)
    diffs = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    inventory = parse_inventory(inventory_text((diffs[0], diffs[0])), what="inv")
    part, public = export_cpu(tmp_path, shipped_cells, engine=engine, against=inventory)
    empty = FakeEngine()
    with pytest.raises(BundleError, match=(
            rf"a delta bundle whose 1 base layer\(s\) this engine lacks: {diffs[0]} "
            rf"\(diff {diffs[0]}\); load the bundle it was made against first")):
        loading.load(empty, part.out_dir, site=site_trusting(public))
    assert empty.loaded == []  # refused before the engine read a byte


# --- the registry scripts' usage errors: one line, exit 2, nothing run ----------------------


@pytest.mark.parametrize(("script", "args", "message"), [
    ("push.sh", ["127.0.0.1:5000/Site"], "'Site' is not a repository path component"),
    ("push.sh", ["127.0.0.1:5000/a//b"], "'' is not a repository path component"),
    ("push.sh", ["user@host/x"], "is not HOST[:PORT][/PREFIX]"),
    ("push.sh", [], "usage: push.sh HOST"),
    ("push.sh", ["127.0.0.1:5000", "--ca-cert", "/nonexistent"], "--ca-cert /nonexistent is not a file"),
    ("pull.sh", ["127.0.0.1:5000/../x"], "is not a repository path component"),
    ("pull.sh", ["127.0.0.1:5000", "--bogus"], "unknown option --bogus"),
    ("registry.sh", ["start", "--listen", "0.0.0.0"], "is not ADDR:PORT"),
    ("registry.sh", ["start", "--tls-cert", "/etc/hostname"], "--tls-cert and --tls-key go together"),
    ("registry.sh", ["restart"], "usage: registry.sh start"),
    ("inventory.sh", ["--json"], "unknown argument --json"),
])
def test_registry_scripts_refuse_bad_usage_before_anything_runs(tmp_path, shipped_cells, shim,
                                                                script, args, message):
    part, public = export_cpu(tmp_path, shipped_cells)
    env = {**shim, "STACKPIN_PUBKEY": str(public),
           "STACKPIN_REGISTRY_DIR": str(tmp_path / "registry")}
    done = _run(part.out_dir / "bin" / script, *args, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("FAIL  ") and message in line, line
    assert Path(shim["SHIM_LOG"]).read_text() == ""  # the engine was never asked
    assert not (tmp_path / "registry").exists()
