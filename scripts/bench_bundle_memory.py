"""Peak RSS of `bundle verify` and of the load pipeline as the images grow (docs/benchmarks.md).

    .venv/bin/python scripts/bench_bundle_memory.py [SIZE_MIB...]   (default: 64 256 1024)

For each size a signed bundle is written to a temp folder whose images.tar.zst holds a tar
of that many MiB (a 4 MiB random block repeated: zstd's 2 MiB window cannot shrink it).
Each measurement runs in its own child process, so ru_maxrss is that run's peak alone:

- verify: `stackpin bundle verify DIR --pubkey KEY` (the CLI, everything checked);
- load:   `bundle.load.load` with an engine that consumes the decompressed stream and
  discards it (the daemon's own memory is the daemon's; this is stackpin's side);
- bomb:   a 1 GiB-of-zeros zstd frame (~32 KiB) loaded with --insecure-unsigned while the
  manifest declares 1 MiB: refused after 1 MiB of output.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import zstandard

from stackpin import signing
from stackpin.bundle.format import FileEntry, manifest_bytes, sha256sums_text

ROOT = Path(__file__).resolve().parents[1]
BLOCK = os.urandom(4 << 20)


def _images(path: Path, mib: int) -> int:
    """images.tar.zst of one member of ``mib`` MiB; returns the tar size."""
    with path.open("wb") as out:
        writer = zstandard.ZstdCompressor(level=1).stream_writer(out)
        info = tarfile.TarInfo("layer.bin")
        info.size = mib << 20
        writer.write(info.tobuf())
        for offset in range(0, info.size, len(BLOCK)):
            writer.write(BLOCK[: min(len(BLOCK), info.size - offset)])
        tail = (-info.size) % 512 + 1024
        writer.write(bytes(tail))
        writer.flush(zstandard.FLUSH_FRAME)
        return 512 + info.size + tail


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_bundle(folder: Path, mib: int, key: Path, *, bomb: bool = False) -> None:
    folder.mkdir(parents=True)
    if bomb:
        data = zstandard.ZstdCompressor(level=19).compress(bytes(1 << 30))
        (folder / "images.tar.zst").write_bytes(data)
        tar_bytes = 1 << 20
    else:
        tar_bytes = _images(folder / "images.tar.zst", mib)
    entries = [FileEntry(path="images.tar.zst", size=(folder / "images.tar.zst").stat().st_size,
                         sha256=_sha(folder / "images.tar.zst"))]
    (folder / "SHA256SUMS").write_text(sha256sums_text(entries))
    entries.append(FileEntry(path="SHA256SUMS", size=(folder / "SHA256SUMS").stat().st_size,
                             sha256=_sha(folder / "SHA256SUMS")))
    image_id = "sha256:" + "ab" * 32
    manifest = {
        "format": "stackpin-bundle", "format_version": 1, "created": "2025-01-01T00:00:00Z",
        "signed_by": None, "sha256sums": entries[1].sha256,
        "images_archive": {"tar_bytes": tar_bytes},
        "images": [{"cell": "bench", "variant": "stable", "profile": "stable", "id": image_id,
                    "tags": ["stackpin/bench:stable"], "port": 18888, "platform": "cpu",
                    "cpu_arch": "x86_64", "arch": [], "labels": {}, "run": {}, "size": 1}],
        "files": [e.__dict__ for e in sorted(entries, key=lambda e: e.path)],
    }
    data = manifest_bytes(manifest)
    (folder / "manifest.json").write_bytes(data)
    (folder / "manifest.sig").write_bytes(signing.sign(data, signing.load_private(key)))


LOAD = """
import sys
from pathlib import Path
from stackpin.bundle import load, trust
from stackpin.errors import BundleError

class Sink:
    loaded = False
    def load(self, chunks):
        total = sum(len(c) for c in chunks)
        self.loaded = True
        return total
    def image_info(self, ref):
        return self.loaded or None
    def remove_image(self, ref, force=False):
        return True

key = Path(sys.argv[2])
site = trust.insecure() if sys.argv[3] == "insecure" else trust.trusted_key(key, "bench")
try:
    load.load(Sink(), Path(sys.argv[1]), site=site)
except BundleError as exc:
    print(exc.message[-120:])
"""


OLD_WAY = """
import sys, zstandard
out = zstandard.ZstdDecompressor().decompressobj()
with open(sys.argv[1], "rb") as handle:
    while chunk := handle.read(1 << 20):
        out.decompress(chunk)
"""

WRAP = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.returncode, *tail)
"""


def peak_mib(argv: list[str]) -> tuple[float, int, str]:
    """Peak RSS (MiB) of argv alone: a fresh wrapper process waits for it and reads its
    ru_maxrss (RUSAGE_CHILDREN is a running maximum, so one wrapper per measurement)."""
    done = subprocess.run([sys.executable, "-c", WRAP, *argv], capture_output=True, text=True,
                          check=True)
    kib, code, *tail = done.stdout.split(" ", 2)
    return int(kib) / 1024, int(code), " ".join(tail).strip()


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [64, 256, 1024]
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        keys = signing.generate(work / "keys")
        print("| images (tar MiB) | verify peak RSS (MiB) | load pipeline peak RSS (MiB) |")
        print("|---|---|---|")
        for mib in sizes:
            folder = work / f"b{mib}"
            write_bundle(folder, mib, keys.private_path)
            # ru_maxrss of RUSAGE_CHILDREN is the max over children so far: run the largest
            # last, or measure each in a fresh parent. Sizes ascend, so each row is its own.
            verify, code, out = peak_mib([python, "-m", "stackpin.cli.main", "bundle", "verify",
                                          str(folder), "--pubkey", str(keys.public_path)])
            assert code == 0, out
            load, code, out = peak_mib([python, "-c", LOAD, str(folder), str(keys.public_path),
                                        "trusted"])
            assert code == 0, out
            assert not out, out
            print(f"| {mib} | {verify:.0f} | {load:.0f} |")
        bomb = work / "bomb"
        write_bundle(bomb, 0, keys.private_path, bomb=True)
        load, code, out = peak_mib([python, "-c", LOAD, str(bomb), str(keys.public_path),
                                    "insecure"])
        assert "bytes the manifest declares" in out, out
        size = (bomb / "images.tar.zst").stat().st_size // 1024
        print(f"| zstd bomb: 1 GiB of zeros in {size} KiB, 1 MiB declared | - | {load:.0f} "
              "(refused: decompresses to more than the declared size) |")
        before, _, _ = peak_mib([python, "-c", OLD_WAY, str(bomb / "images.tar.zst")])
        print(f"| the same bomb, one decompress() per 1 MiB input (before issue 14) | - | "
              f"{before:.0f} |")


if __name__ == "__main__":
    main()
