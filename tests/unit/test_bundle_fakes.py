"""Fakes shared by the bundle tests: an engine with images and a save stream, no daemon.

(Named test_bundle_* to stay within the bundle's files; it holds no tests itself.)
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stackpin import signing
from stackpin.bundle import export as exporting
from stackpin.bundle import format as bundle_format
from stackpin.engine import ImageInfo, LoadResult, RunRequest, RunResult, SaveRequest
from stackpin.lock import read_lock
from stackpin.matrix import Cell
from stackpin.render import base_reference, image_tags

ROOT = Path(__file__).resolve().parents[2]
CPU_CELL = "cpu-bookworm-torch2130-py311"
EPOCH = 1735689600
STUDIO_NOTICE = "GNU AFFERO GENERAL PUBLIC LICENSE\nVersion 3, 19 November 2007\n"

PROBE_OUTPUT = json.dumps({
    "os": {"id": "debian", "version_id": "12"},
    "python": "3.11.2",
    "debs": [["python3", "3.11.2-1+b1", "amd64"], ["bash", "5.2.15-2+b2", "amd64"]],
    "dists": [["torch", "2.13.0+cpu", "expression", "BSD-3-Clause"],
              ["numpy", "1.26.4", "name", "BSD License"], ["Jinja2", "3.1.4", "", ""],
              ["unsloth", "2026.10.9", "expression", "Apache-2.0"]],
    "notices": [["unsloth", "studio/LICENSE.AGPL-3.0", STUDIO_NOTICE]],
})


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: int = EPOCH) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    tar.addfile(info, io.BytesIO(data))


def save_archive(images: list[tuple[str, tuple[str, ...]]], *, reverse: bool = False,
                 layer_bytes: int = 3 << 20) -> bytes:
    """A `docker save`-shaped tar: config, one layer per image, manifest.json, repositories.

    The layer holds half random, half repetitive bytes so compression has work to do.
    """
    rng = random.Random(7)
    buffer = io.BytesIO()
    entries = []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for image_id, tags in images:
            hexid = image_id.removeprefix("sha256:")
            layer = hashlib.sha256(hexid.encode()).hexdigest()
            _add(tar, f"{hexid}.json", json.dumps({"id": hexid}).encode())
            dir_info = tarfile.TarInfo(f"{layer}/")
            dir_info.type = tarfile.DIRTYPE
            tar.addfile(dir_info)
            _add(tar, f"{layer}/VERSION", b"1.0")
            body = rng.randbytes(layer_bytes // 2) + bytes(layer_bytes // 2)
            _add(tar, f"{layer}/layer.tar", body)
            entries.append({"Config": f"{hexid}.json", "RepoTags": list(tags),
                            "Layers": [f"{layer}/layer.tar"]})
        if reverse:
            entries.reverse()
        _add(tar, "manifest.json", json.dumps(entries).encode() + b"\n", mtime=0)
        _add(tar, "repositories", b"{}\n", mtime=0)
    return buffer.getvalue()


@dataclass
class FakeEngine:
    """The engine seam: images by tag, a save stream, the SBOM probe, a recorded load."""

    images: dict[str, ImageInfo] = field(default_factory=dict)
    saved: list[SaveRequest] = field(default_factory=list)
    loaded: list[bytes] = field(default_factory=list)
    runs: list[RunRequest] = field(default_factory=list)
    reverse_manifest: bool = False
    interrupt_after: int | None = None  # raise KeyboardInterrupt after this many chunks
    removed: list[str] = field(default_factory=list)

    def add(self, info: ImageInfo) -> None:
        for tag in info.tags:
            self.images[tag] = info
        self.images[info.id] = info

    def image_info(self, reference: str) -> ImageInfo | None:
        return self.images.get(reference)

    def save(self, request: SaveRequest) -> Iterator[bytes]:
        self.saved.append(request)
        infos = {self.images[n].id: self.images[n] for n in request.images}
        data = save_archive([(i, tuple(sorted(t for t in request.images if self.images[t].id == i)))
                             for i in sorted(infos)], reverse=self.reverse_manifest)
        for count, start in enumerate(range(0, len(data), 1 << 16)):
            if self.interrupt_after is not None and count >= self.interrupt_after:
                raise KeyboardInterrupt
            yield data[start:start + (1 << 16)]

    def run_to_completion(self, request: RunRequest, *, timeout_s: int) -> RunResult:
        self.runs.append(request)
        return RunResult(exit_code=0, timed_out=False, logs="", stdout=PROBE_OUTPUT + "\n")

    def load(self, source: object) -> LoadResult:
        data = b"".join(source)  # type: ignore[attr-defined]
        self.loaded.append(data)
        return LoadResult(references=(), image_ids=())

    def remove_image(self, reference: str, *, force: bool = False) -> bool:
        self.removed.append(reference)
        return True


def image_for(cell: Cell, variant: str, lock_digest: str, *, env: tuple[str, ...] = (),
              labels: dict[str, str] | None = None, image_id: str = "") -> ImageInfo:
    tags = image_tags(cell, variant, lock_digest)  # type: ignore[arg-type]
    return ImageInfo(
        id=image_id or "sha256:" + hashlib.sha256(f"{cell.id}{variant}".encode()).hexdigest(),
        tags=tags, repo_digests=(),
        labels={"io.stackpin.cell": cell.id, "io.stackpin.variant": variant,
                "io.stackpin.lock-digest": lock_digest, **(labels or {})},
        size=123456, created="2025-01-01T00:00:00Z",
        env=("PATH=/opt/stackpin/venv/bin:/usr/bin", "TOKENIZERS_PARALLELISM=false", *env),
        entrypoint=("/opt/stackpin/entrypoint.sh",), cmd=(), diff_ids=(),
        architecture="amd64", os="linux",
    )


def project(tmp_path: Path, *, report: bytes | None = b'{"summary": "ok"}\n') -> Path:
    """A project root that reuses the repository's templates and bundle skeleton."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "templates").symlink_to(ROOT / "templates")
    (root / "bundle").symlink_to(ROOT / "bundle")
    if report is not None:
        (root / "build" / "reports").mkdir(parents=True)
        (root / "build" / "reports" / "cpu.json").write_bytes(report)
    return root


def cpu_selection(cells: dict[str, Cell]) -> bundle_format.Selection:
    lock = read_lock(ROOT, CPU_CELL)
    assert lock is not None
    return bundle_format.Selection(cell=cells[CPU_CELL], variant="stable", lock=lock)


BASE_ID = "sha256:" + "ba5e" * 16


def base_image(cell: Cell) -> ImageInfo:
    return ImageInfo(id=BASE_ID, tags=(base_reference(cell),), repo_digests=(), labels={},
                     size=1, created="", env=(), entrypoint=(), cmd=(), diff_ids=(),
                     architecture="amd64", os="linux")


def engine_with_cpu(cells: dict[str, Cell], **image_options: object) -> FakeEngine:
    selection = cpu_selection(cells)
    engine = FakeEngine()
    engine.add(base_image(selection.cell))
    engine.add(image_for(selection.cell, "stable", selection.lock.digest,
                         **image_options))  # type: ignore[arg-type]
    return engine


def export_cpu(tmp_path: Path, cells: dict[str, Cell], *, name: str = "bundle",
               sign: bool = True, engine: FakeEngine | None = None, **options: object
               ) -> tuple[exporting.ExportResult, Path | None]:
    keys = tmp_path / "keys"
    if sign and not (keys / "stackpin.key").exists():
        signing.generate(keys)
    public = keys / "stackpin.pub" if sign else None
    root = tmp_path / "project" if (tmp_path / "project").exists() else project(tmp_path)
    request = bundle_format.ExportRequest(
        selections=(cpu_selection(cells),), out_dir=tmp_path / "out" / name, root=root,
        sign_key=keys / "stackpin.key" if sign else None, **options,  # type: ignore[arg-type]
    )
    return exporting.export(engine or engine_with_cpu(cells), request), public
