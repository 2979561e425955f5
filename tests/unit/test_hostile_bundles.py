"""A generated corpus of hostile bundles: each one is refused with one line (exit 7 through
the CLI) before the engine sees a byte, whatever part of the bundle was attacked.

One good signed bundle (folder and archive) is exported once; every case copies it and
damages the copy the way an attacker in transit, a broken disk or a compromised build host
would: truncation, flipped bytes, extra/missing/linked members, traversal paths, zstd
bombs, foreign keys, re-signing, replayed signatures, malformed manifests under the real
key, and hostile tar headers.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner
from test_bundle_fakes import engine_with_cpu, export_cpu, site_trusting

from stackpin import signing
from stackpin.bundle import load as loading
from stackpin.bundle import trust
from stackpin.bundle import verify as verifying
from stackpin.bundle.format import manifest_bytes
from stackpin.cli.main import cli
from stackpin.errors import BundleError


@dataclass(frozen=True)
class Good:
    folder: Path
    archive: Path
    keys: Path
    public: Path


@pytest.fixture(scope="module")
def good(tmp_path_factory, shipped_cells) -> Good:
    work = tmp_path_factory.mktemp("good")
    result, public = export_cpu(work, shipped_cells, archive=True)
    assert result.archive is not None
    assert public is not None
    return Good(result.out_dir, result.archive, work / "keys", public)


# --- damage helpers ---------------------------------------------------------------------


def _flip(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x40
    path.write_bytes(bytes(data))


def _cut(path: Path, keep: float = 0.5) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def _sign(folder: Path, data: bytes, key_dir: Path) -> None:
    """Write ``data`` as the manifest, signed with the key in ``key_dir``."""
    (folder / "manifest.json").write_bytes(data)
    key = signing.load_private(key_dir / "stackpin.key")
    (folder / "manifest.sig").write_bytes(signing.sign(data, key))


def _manifest(folder: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((folder / "manifest.json").read_bytes())


def _edit(folder: Path, keys: Path, change: Callable[[dict], object]) -> None:  # type: ignore[type-arg]
    manifest = _manifest(folder)
    change(manifest)
    _sign(folder, manifest_bytes(manifest), keys)


def _bomb() -> bytes:
    return zstandard.ZstdCompressor(level=19).compress(bytes(256 << 20))  # 256 MiB of zeros


def _set_images(folder: Path, data: bytes, keys: Path, *, tar_bytes: int | None = None) -> None:
    """Replace images.tar.zst and re-seal everything with ``keys`` (a compromised key)."""
    import hashlib

    (folder / "images.tar.zst").write_bytes(data)
    manifest = _manifest(folder)
    for entry in manifest["files"]:
        if entry["path"] == "images.tar.zst":
            entry["size"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    sums = "".join(f"{e['sha256']}  {e['path']}\n" for e in sorted(
        manifest["files"], key=lambda e: e["path"]) if e["path"] != "SHA256SUMS")
    (folder / "SHA256SUMS").write_text(sums)
    digest = hashlib.sha256(sums.encode()).hexdigest()
    for entry in manifest["files"]:
        if entry["path"] == "SHA256SUMS":
            entry["size"], entry["sha256"] = len(sums.encode()), digest
    manifest["sha256sums"] = digest
    if tar_bytes is not None:
        manifest["images_archive"]["tar_bytes"] = tar_bytes
    _sign(folder, manifest_bytes(manifest), keys)


def _other_keys(work: Path) -> Path:
    signing.generate(work / "attacker")
    return work / "attacker"


# --- the folder corpus ------------------------------------------------------------------

# name -> (damage(folder, good, work), pattern of the one-line refusal)
Damage = Callable[[Path, Good, Path], None]
FOLDER_CASES: dict[str, tuple[Damage, str]] = {
    "truncated images": (lambda f, g, w: _cut(f / "images.tar.zst"), r"images.tar.zst is \d+ bytes"),
    "truncated manifest": (lambda f, g, w: _cut(f / "manifest.json"), "signature does not match"),
    "truncated signature": (lambda f, g, w: _cut(f / "manifest.sig"), "signature is 32 bytes"),
    "empty signature": (lambda f, g, w: (f / "manifest.sig").write_bytes(b""),
                        "signature is 0 bytes"),
    "long signature": (lambda f, g, w: (f / "manifest.sig").write_bytes(bytes(65)),
                       "larger than 64 bytes"),
    "flipped images": (lambda f, g, w: _flip(f / "images.tar.zst"), "does not match its sha256"),
    "flipped manifest": (lambda f, g, w: _flip(f / "manifest.json"), "signature does not match"),
    "flipped signature": (lambda f, g, w: _flip(f / "manifest.sig"), "signature does not match"),
    "flipped sums": (lambda f, g, w: _flip(f / "SHA256SUMS"), "SHA256SUMS does not match"),
    "flipped script": (lambda f, g, w: _flip(f / "bin" / "load.sh"), "load.sh does not match"),
    "extra top file": (lambda f, g, w: (f / "evil.sh").write_text("x"), "evil.sh is not in"),
    "extra nested file": (lambda f, g, w: (f / "sbom" / "x.json").write_text("{}"),
                          "sbom/x.json is not in"),
    "hidden extra file": (lambda f, g, w: (f / "bin" / ".profile").write_text("x"),
                          r"'bin/\.profile' is not a bundle file name"),
    "newline in a name": (lambda f, g, w: (f / "sbom" / "a\nPASS ok").write_text("x"),
                          r"is not a bundle file name"),
    "missing images": (lambda f, g, w: (f / "images.tar.zst").unlink(), "images.tar.zst is missing"),
    "missing sums": (lambda f, g, w: (f / "SHA256SUMS").unlink(), "SHA256SUMS is missing"),
    "missing manifest": (lambda f, g, w: (f / "manifest.json").unlink(), "manifest.json is missing"),
    "missing signature": (lambda f, g, w: (f / "manifest.sig").unlink(),
                          "manifest.sig is missing: refusing an unsigned bundle"),
    "missing script": (lambda f, g, w: (f / "bin" / "lib.sh").unlink(), "bin/lib.sh is missing"),
    "symlinked file": (lambda f, g, w: _relink(f / "README.md"), "README.md is a link"),
    "symlinked folder": (lambda f, g, w: (f / "extra").symlink_to(f / "bin"), "extra is a link"),
    "manifest is /dev/zero": (lambda f, g, w: _replace_link(f / "manifest.json", "/dev/zero"),
                              "manifest.json is a link"),
    "fifo": (lambda f, g, w: os.mkfifo(f / "sbom" / "pipe"), "is a device, fifo or socket"),
    "huge manifest": (lambda f, g, w: _grow(f / "manifest.json", 17 << 20),
                      "larger than 16777216 bytes"),
    "wrong key": (lambda f, g, w: _sign(f, (f / "manifest.json").read_bytes(), _other_keys(w)),
                  "signature does not match manifest.json for key"),
    "re-signed by an attacker": (
        lambda f, g, w: _edit(f, _other_keys(w), lambda m: m["images"][0].update(port=1)),
        "signature does not match"),
    "replayed signature": (lambda f, g, w: (f / "manifest.sig").write_bytes(signing.sign(
        b"an older manifest", signing.load_private(g.keys / "stackpin.key"))),
        "signature does not match"),
    "unsigned opt-out not given": (lambda f, g, w: (f / "manifest.sig").unlink(),
                                   "refusing an unsigned bundle"),
    "zstd bomb in transit": (lambda f, g, w: (f / "images.tar.zst").write_bytes(_bomb()),
                             r"images.tar.zst is \d+ bytes"),
    # What only a compromised build host (the real key) can write: the schema still holds.
    "traversal path, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m["files"].append(
        {"path": "../../etc/cron.d/x", "size": 1, "sha256": "0" * 64})), "lists an unsafe path"),
    "absolute path, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m["files"].append(
        {"path": "/etc/passwd", "size": 1, "sha256": "0" * 64})), "lists an unsafe path"),
    "duplicate path, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m["files"].append(
        dict(m["files"][0]))), "lists a path twice"),
    "string for files, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m.update(
        files="all of them")), "files: is str, not a list"),
    "missing key, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m.pop("images")),
                              "'images' is missing"),
    "size as text, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m["files"][0].update(
        size="12")), r"files\[0\]\.size: is str, not an integer"),
    "negative size, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m["files"][0].update(
        size=-1)), "outside 0"),
    "port out of range, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m["images"][0]
                                                          .update(port=70000)), "outside 1..65535"),
    "bool for a number, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m[
        "images_archive"].update(tar_bytes=True)), "is bool, not an integer"),
    "deep nesting, real key": (lambda f, g, w: _sign(f, b"[" * 200_000 + b"]" * 200_000, g.keys),
                               "nested too deeply"),
    "5000-digit number, real key": (lambda f, g, w: _sign(f, b'{"format": ' + b"9" * 5000 + b"}",
                                                          g.keys), "integer of 5000 digits"),
    "NaN, real key": (lambda f, g, w: _sign(f, b'{"format": NaN}', g.keys), "NaN is not JSON"),
    "non-UTF-8, real key": (lambda f, g, w: _sign(f, b'{"format": "\xff"}', g.keys),
                            "not UTF-8"),
    "a list, real key": (lambda f, g, w: _sign(f, b"[]", g.keys), "is not a stackpin-bundle"),
    "newer format, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m.update(
        format_version=2)), "bundle format 2 is not 1"),
    "image id not a digest, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m["images"][0]
                                                              .update(id="alpine")),
                                        r"images\[0\]\.id: is not a valid value"),
    "tag with a newline, real key": (lambda f, g, w: _edit(f, g.keys, lambda m: m["images"][0][
        "tags"].append("x:1\nPASS")), r"is not a valid value \('x:1\\nPASS'\)"),
    # A bomb sealed with the real key still cannot exceed the size the manifest declares,
    # and a declared size that is not the real one is refused before the stream completes.
    "zstd bomb, real key": (lambda f, g, w: _set_images(f, _bomb(), g.keys, tar_bytes=1 << 20),
                            "decompresses to more than the 1048576 bytes"),
    "declared size too large, real key": (
        lambda f, g, w: _edit(f, g.keys, lambda m: m["images_archive"].update(
            tar_bytes=m["images_archive"]["tar_bytes"] + 512)), r"decompresses to \d+ bytes, not"),
    "not zstd, real key": (lambda f, g, w: _set_images(f, b"plain tar bytes" * 100, g.keys),
                           "is not a valid zstd stream"),
}


def _relink(path: Path) -> None:
    copy = path.with_name(path.name + ".real")
    path.rename(copy)
    path.symlink_to(copy.name)


def _replace_link(path: Path, target: str) -> None:
    path.unlink()
    path.symlink_to(target)


def _grow(path: Path, size: int) -> None:
    with path.open("r+b") as handle:
        handle.truncate(size)  # sparse: no disk, but reading it whole would cost `size`


@pytest.mark.parametrize("case", sorted(FOLDER_CASES))
def test_hostile_folder_is_refused_before_the_engine(good, shipped_cells, tmp_path, case):
    damage, pattern = FOLDER_CASES[case]
    folder = tmp_path / "bundle"
    shutil.copytree(good.folder, folder, symlinks=True)
    damage(folder, good, tmp_path)
    _refused(folder, good, pattern, shipped_cells)


def _refused(source: Path, good: Good, pattern: str, shipped_cells) -> None:  # type: ignore[no-untyped-def]
    """Refused by load with one line and no engine call, and by the CLI with exit 7."""
    engine = engine_with_cpu(shipped_cells)
    with pytest.raises(BundleError, match=pattern) as caught:
        loading.load(engine, source, site=site_trusting(good.public))
    assert "\n" not in caught.value.message
    assert engine.loaded == []
    done = CliRunner().invoke(cli, ["bundle", "verify", str(source), "--pubkey",
                                    str(good.public)])
    if "decompresses" in pattern or "zstd stream" in pattern:
        return  # verify checks files, not their decompressed content: load refuses these
    assert done.exit_code == 7, done.output
    assert len(done.output.strip().splitlines()) == 1, done.output


def test_a_flood_of_empty_folders_is_refused_at_the_member_cap(good, shipped_cells, tmp_path,
                                                                monkeypatch):
    # The real cap is 110,000 entries; a smaller one keeps the test fast, same code path.
    monkeypatch.setattr(verifying, "MAX_MEMBERS", 300)
    folder = tmp_path / "bundle"
    shutil.copytree(good.folder, folder)
    for index in range(301):
        (folder / "sbom" / f"d{index}").mkdir()
    _refused(folder, good, "more than 300 files and folders", shipped_cells)


def test_the_opt_out_still_refuses_everything_but_the_signature(good, shipped_cells, tmp_path):
    folder = tmp_path / "bundle"
    shutil.copytree(good.folder, folder)
    (folder / "manifest.sig").unlink()
    engine = engine_with_cpu(shipped_cells)
    report = loading.load(engine, folder, site=trust.insecure())
    assert report.verified.signature == "not checked (insecure)"
    assert len(engine.loaded) == 1
    _set_images(folder, _bomb(), good.keys, tar_bytes=1 << 20)
    (folder / "manifest.sig").unlink()
    engine = engine_with_cpu(shipped_cells)
    with pytest.raises(BundleError, match="decompresses to more than"):
        loading.load(engine, folder, site=trust.insecure())
    assert engine.loaded == []


# --- the archive corpus -----------------------------------------------------------------


def _members(archive: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(archive) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None)  # type: ignore[union-attr]
                for m in tar.getmembers()]


def _pack(archive: Path, members: list[tuple[tarfile.TarInfo, bytes | None]],
          fmt: int = tarfile.PAX_FORMAT) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    archive.write_bytes(buffer.getvalue())


def _member(name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"x",
            link: str = "", pax: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    if pax:
        info.pax_headers = pax
    return info, data if kind == tarfile.REGTYPE else None


def _append(member: tuple[tarfile.TarInfo, bytes | None]) -> Callable[[Path], None]:
    return lambda archive: _pack(archive, [*_members(archive), member])


def _drop(name: str) -> Callable[[Path], None]:
    return lambda archive: _pack(archive, [m for m in _members(archive) if m[0].name != name])


def _swap_first_two_files(archive: Path) -> None:
    members = _members(archive)
    files = [i for i, (m, _) in enumerate(members) if m.isfile()]
    a, b = files[0], files[2]
    members[a], members[b] = members[b], members[a]
    _pack(archive, members)


def _raw_header_bomb(archive: Path, kind: bytes) -> None:
    """A pax ('x') or GNU long-name ('L') header claiming 1 GiB, then the archive."""
    info = tarfile.TarInfo("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "pax")
    info.type = kind
    info.size = 1 << 30
    header = info.tobuf(format=tarfile.USTAR_FORMAT if kind == tarfile.XHDTYPE
                        else tarfile.GNU_FORMAT)[:512]
    archive.write_bytes(header + bytes(4096) + archive.read_bytes())


ARCHIVE_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (lambda a: _cut(a, 0.5), "unreadable or truncated|is missing"),
    "truncated in a header": (lambda a: _cut(a, 0.0001), "unreadable or truncated|is missing"),
    "flipped byte": (lambda a: _flip(a, 0.6), "does not match|unreadable|is missing"),
    "extra member": (_append(_member("bundle/sbom/new.json")), "not in the manifest"),
    "missing member": (_drop("bundle/bin/stop.sh"), "bin/stop.sh is missing"),
    "symlink member": (_append(_member("bundle/bin/x", tarfile.SYMTYPE, link="/etc/passwd")),
                       "is a link"),
    "hardlink member": (_append(_member("bundle/bin/y", tarfile.LNKTYPE, link="bundle/README.md")),
                        "is a link"),
    "device member": (_append(_member("bundle/dev/sda", tarfile.BLKTYPE)), "device or fifo"),
    "fifo member": (_append(_member("bundle/p", tarfile.FIFOTYPE)), "device or fifo"),
    "absolute member": (_append(_member("/etc/cron.d/x")), "absolute path"),
    "traversal member": (_append(_member("bundle/../../x")), "climbs out"),
    "pax path traversal": (_append(_member("bundle/ok", pax={"path": "bundle/../../etc/x"})),
                           "climbs out"),
    "second top folder": (_append(_member("other/README.md")), "outside the bundle folder"),
    "duplicate member": (_append(_member("bundle/README.md")), "appears twice"),
    "member before the manifest": (_swap_first_two_files, "comes before manifest.json"),
    "pax header bomb": (lambda a: _raw_header_bomb(a, tarfile.XHDTYPE),
                        "an extended header of 1073741824 bytes"),
    "long-name header bomb": (lambda a: _raw_header_bomb(a, tarfile.GNUTYPE_LONGNAME),
                              "an extended header of 1073741824 bytes"),
    "sparse member": (_append(_member("bundle/sparse", tarfile.GNUTYPE_SPARSE)),
                      "a sparse member"),
    "not a tar": (lambda a: a.write_bytes(os.urandom(4096)), "unreadable|not under one"),
    "empty file": (lambda a: a.write_bytes(b""), "unreadable|is missing"),
    "gzip instead of tar": (lambda a: a.write_bytes(__import__("gzip").compress(a.read_bytes())),
                            "unreadable|not under one|is missing"),
}


@pytest.mark.parametrize("case", sorted(ARCHIVE_CASES))
def test_hostile_archive_is_refused_before_the_engine(good, shipped_cells, tmp_path, case):
    damage, pattern = ARCHIVE_CASES[case]
    archive = tmp_path / "bundle.tar"
    shutil.copyfile(good.archive, archive)
    damage(archive)
    _refused(archive, good, pattern, shipped_cells)


def test_the_good_bundle_loads(good, shipped_cells):
    """The corpus's control: undamaged, both forms load (so the refusals above are real)."""
    for source in (good.folder, good.archive):
        engine = engine_with_cpu(shipped_cells)
        loading.load(engine, source, site=site_trusting(good.public))
        assert len(engine.loaded) == 1


def test_the_sites_own_models_may_have_any_name(good, shipped_cells, tmp_path):
    folder = tmp_path / "bundle"
    shutil.copytree(good.folder, folder)
    (folder / "models" / "My Model v2").mkdir(parents=True, exist_ok=True)
    (folder / "models" / "My Model v2" / "weights (1).gguf").write_bytes(b"GGUF")
    verified = verifying.verify(folder, site=site_trusting(good.public))
    assert verified.signature == "verified"
