"""Every tampering case is refused with one line, before anything reaches the engine."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import zstandard
from test_bundle_fakes import engine_with_cpu, export_cpu, resign, site_trusting, unzstd

from stackpin import signing
from stackpin.bundle import format as bundle_format
from stackpin.bundle import load as loading
from stackpin.bundle import trust
from stackpin.bundle import verify as verifying
from stackpin.errors import BundleError
from stackpin.primitives import sha256_file


@pytest.fixture
def exported(tmp_path, shipped_cells):
    result, public = export_cpu(tmp_path, shipped_cells, archive=True)
    return result, public


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _refused(source: Path, pattern: str, pubkey: Path | None = None, *,
             site: trust.Trust | None = None):
    """Refused with one line; the site trusts the exporter's key unless told otherwise."""
    public = pubkey or source.parent.parent / "keys" / "stackpin.pub"
    with pytest.raises(BundleError, match=pattern) as caught:
        verifying.verify(source, site=site or site_trusting(public))
    assert "\n" not in caught.value.message
    return caught.value.message


# --- folders ------------------------------------------------------------------------------


def test_a_flipped_byte_is_refused(exported):
    result, public = exported
    _flip(result.out_dir / "images.tar.zst", 1000)
    _refused(result.out_dir, r"images.tar.zst does not match its sha256", public)


def test_a_truncated_file_is_refused(exported):
    result, public = exported
    path = result.out_dir / "images.tar.zst"
    path.write_bytes(path.read_bytes()[:-10])
    _refused(result.out_dir, r"images.tar.zst is \d+ bytes, not \d+ \(truncated", public)


def test_a_missing_file_is_refused(exported):
    result, public = exported
    (result.out_dir / "bin" / "stop.sh").unlink()
    _refused(result.out_dir, r"bin/stop.sh is missing", public)


def test_an_extra_file_is_refused(exported):
    result, public = exported
    (result.out_dir / "sbom" / "extra.json").write_text("{}")
    _refused(result.out_dir, r"sbom/extra.json is not in the manifest \(an extra file\)", public)


def test_a_manifest_edited_after_signing_is_refused(exported):
    result, public = exported
    path = result.out_dir / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"port": 18888', b'"port": 18880'))
    _refused(result.out_dir, r"does not match manifest.json for key ed25519:", public)


def test_a_missing_signature_is_refused(exported):
    result, public = exported
    (result.out_dir / "manifest.sig").unlink()
    _refused(result.out_dir, r"manifest.sig is missing: refusing an unsigned bundle", public)
    # Only the explicit opt-out passes it, and the state says the signature was not checked.
    insecure = verifying.verify(result.out_dir, site=trust.insecure())
    assert insecure.signature == "not checked (insecure)"


def test_another_key_is_refused(exported, tmp_path):
    result, _ = exported
    other = signing.generate(tmp_path / "other")
    _refused(result.out_dir, r"signed with another key", other.public_path)


def test_sha256sums_rewritten_to_match_a_tampered_file_is_refused(exported):
    result, _ = exported
    out = result.out_dir
    (out / "bin" / "stop.sh").write_text("#!/bin/bash\necho owned\n")
    sums = out / "SHA256SUMS"
    lines = [f"{sha256_file(out / 'bin/stop.sh')}  bin/stop.sh"
             if line.endswith("bin/stop.sh") else line for line in sums.read_text().splitlines()]
    sums.write_text("\n".join(lines) + "\n")
    _refused(out, r"SHA256SUMS is \d+ bytes|SHA256SUMS does not match|bin/stop.sh is \d+ bytes")


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_links_and_special_files_are_refused(exported, kind):
    result, public = exported
    target = result.out_dir / "sbom" / "odd"
    if kind == "symlink":
        target.symlink_to("/etc/passwd")
    else:
        os.mkfifo(target)
    _refused(result.out_dir, r"sbom/odd is a (link|device, fifo or socket)", public)


def test_a_manifest_listing_an_unsafe_path_is_refused(exported):
    result, _ = exported
    path = result.out_dir / "manifest.json"
    data = path.read_bytes().replace(b'"path": "README.md"', b'"path": "../README.md"')
    path.write_bytes(data)
    _refused(result.out_dir, r"does not match manifest.json")  # the signature catches it
    resign(result.out_dir, data, result.out_dir.parent.parent / "keys")
    _refused(result.out_dir, r"lists an unsafe path")  # and so does the schema


# --- archives -----------------------------------------------------------------------------


def test_the_archive_verifies_by_streaming(exported):
    result, public = exported
    verified = verifying.verify(result.archive, site=site_trusting(public))
    assert (verified.kind, verified.signature) == ("archive", "verified")
    with tarfile.open(result.archive) as tar:
        names = tar.getnames()
        assert names[0] == "bundle"
        assert names[1:4] == ["bundle/bin", "bundle/bin/profiles", "bundle/dockerfiles"]
        first_files = [m.name for m in tar.getmembers() if m.isfile()][:2]
        assert first_files == ["bundle/manifest.json", "bundle/manifest.sig"]
        assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in tar.getmembers()} == {
            (0, 0, "", "", 1735689600)}


def test_a_flipped_byte_in_the_archive_is_refused(exported):
    result, public = exported
    size = result.archive.stat().st_size
    _flip(result.archive, size // 2)
    _refused(result.archive, r"does not match its sha256|unreadable", public)


def test_a_truncated_archive_is_refused(exported):
    result, public = exported
    data = result.archive.read_bytes()
    result.archive.write_bytes(data[: len(data) // 2])
    _refused(result.archive, r"unreadable or truncated|is missing", public)


def _rewrite(archive: Path, extra: tarfile.TarInfo, body: bytes = b"") -> None:
    """Copy the archive and append one hostile member."""
    buffer = io.BytesIO()
    with tarfile.open(archive) as src, tarfile.open(fileobj=buffer, mode="w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        dst.addfile(extra, io.BytesIO(body) if extra.isfile() else None)
    archive.write_bytes(buffer.getvalue())


def _member(name: str, kind: bytes = tarfile.REGTYPE, *, link: str = "", size: int = 0):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = size
    return info


@pytest.mark.parametrize(("member", "reason"), [
    (_member("/etc/cron.d/x", size=1), "has an absolute path"),
    (_member("bundle/../../x", size=1), r"climbs out with '\.\.'"),
    (_member("bundle/bin/x", tarfile.SYMTYPE, link="/etc/passwd"), "is a link"),
    (_member("bundle/bin/y", tarfile.LNKTYPE, link="bundle/README.md"), "is a link"),
    (_member("bundle/dev/sda", tarfile.BLKTYPE), "is a device or fifo"),
    (_member("bundle/dev/tty", tarfile.CHRTYPE), "is a device or fifo"),
    (_member("other/README.md", size=1), "outside the bundle folder"),
    (_member("bundle/README.md", size=1), "appears twice"),
    (_member("bundle/sbom/new.json", size=1), r"not in the manifest \(an extra file\)"),
])
def test_hostile_archive_members_are_refused(exported, member, reason):
    result, public = exported
    _rewrite(result.archive, member, b"x" * member.size)
    message = _refused(result.archive, reason, public)
    assert "nothing was loaded" in message


# --- load ---------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["dir", "archive"])
def test_load_streams_the_verified_images_into_the_engine(exported, shipped_cells, source):
    result, public = exported
    path = result.out_dir if source == "dir" else result.archive
    engine = engine_with_cpu(shipped_cells)
    report = loading.load(engine, path, site=site_trusting(public))
    (loaded,) = engine.loaded
    compressed = (result.out_dir / "images.tar.zst").read_bytes()
    assert loaded == unzstd(compressed)
    assert report.image_ids == (result.images[0].id,)


@pytest.mark.parametrize("damage", ["flip", "manifest"])
def test_load_of_a_tampered_bundle_never_reaches_the_engine(exported, shipped_cells, damage):
    result, public = exported
    if damage == "flip":
        _flip(result.out_dir / "images.tar.zst", 4096)
    else:
        path = result.out_dir / "manifest.json"
        data = json.loads(path.read_bytes())
        data["images"][0]["tags"].append("evil/x:latest")
        path.write_bytes(bundle_format.manifest_bytes(data))
    engine = engine_with_cpu(shipped_cells)
    with pytest.raises(BundleError, match=r"nothing was loaded|does not match manifest\.json"):
        loading.load(engine, result.out_dir, site=site_trusting(public))
    assert engine.loaded == []


def test_a_file_changed_after_its_check_never_reaches_the_daemon_whole(exported, shipped_cells,
                                                                      monkeypatch):
    # The worst swap: a valid zstd stream of a tar of the same size, one byte of a layer
    # changed, written between the check and the load. Only the hash taken while loading
    # can see it, and the last chunk must still be held back until that hash is compared.
    result, public = exported
    images = result.out_dir / "images.tar.zst"
    tar = bytearray(unzstd(images.read_bytes()))
    tar[len(tar) // 2] ^= 0x01
    checked = loading.verify

    def check_then_swap(*args, **kwargs):
        verified = checked(*args, **kwargs)
        images.write_bytes(zstandard.ZstdCompressor().compress(bytes(tar)))
        return verified

    monkeypatch.setattr(loading, "verify", check_then_swap)
    engine = engine_with_cpu(shipped_cells)
    before, received = dict(engine.images), []
    load = engine.load

    def counted(chunks):
        return load(received.append(len(c)) or c for c in chunks)

    monkeypatch.setattr(engine, "load", counted)
    with pytest.raises(BundleError, match="changed while it was being loaded"):
        loading.load(engine, result.out_dir, site=site_trusting(public))
    assert 0 < sum(received) < len(tar)  # streamed, but never the whole archive
    assert engine.loaded == []
    assert engine.images == before


def test_inspect_reads_the_manifest_of_a_folder_and_an_archive(exported):
    result, public = exported
    site = site_trusting(public)
    assert (verifying.read_manifest(result.out_dir, site=site)
            == verifying.read_manifest(result.archive, site=site))
