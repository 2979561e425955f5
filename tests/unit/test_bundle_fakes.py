"""Helpers shared by the bundle tests: the CPU cell's images in the shared fake engine.

(Named test_bundle_* to stay within the bundle's files; it holds no tests itself.)
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import zstandard
from tests.fake_engine import FakeEngine

from stackpin import signing
from stackpin.build import BuildRecord, sha256_text, write_record
from stackpin.bundle import export as exporting
from stackpin.bundle import format as bundle_format
from stackpin.bundle import trust
from stackpin.context import read_sources
from stackpin.lock import read_lock
from stackpin.matrix import Cell
from stackpin.render import RenderRequest, base_reference, image_tags, render
from stackpin.target import LABEL_DOCKERFILE_SHA256, Layout, Target
from stackpin.verification import write_verified

ROOT = Path(__file__).resolve().parents[2]
CPU_CELL = "cpu-bookworm-torch2130-py311"
EPOCH = 1735689600
REPORT_DIR = f"{CPU_CELL}-stable"
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


def layer_bytes(seed: str, size: int = 3 << 20) -> bytes:
    """Half random, half repetitive bytes, so compression has work to do."""
    return random.Random(seed).randbytes(size // 2) + bytes(size // 2)


def unzstd(data: bytes) -> bytes:
    """Every frame of a zstd stream, decompressed: images.tar.zst is concatenated frames,
    and ``decompressobj().decompress`` would silently stop after the first."""
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    return reader.read()


def image_config(cell: Cell, variant: str, lock_digest: str, *, env: tuple[str, ...] = (),
                 labels: dict[str, str] | None = None) -> dict[str, object]:
    """The config of a built image of ``cell`` as stackpin labels it."""
    return {
        "architecture": "amd64", "os": "linux", "created": "2025-01-01T00:00:00Z",
        "config": {
            "Labels": {"io.stackpin.cell": cell.id, "io.stackpin.variant": variant,
                       "io.stackpin.lock-digest": lock_digest, **(labels or {})},
            "Env": ["PATH=/opt/stackpin/venv/bin:/usr/bin", "TOKENIZERS_PARALLELISM=false", *env],
            "Entrypoint": ["/opt/stackpin/entrypoint.sh"],
        },
    }


def cpu_dockerfile(selection: bundle_format.Selection) -> str:
    """The Dockerfile the fake CPU image was 'built' from (today's templates)."""
    return render(RenderRequest(cell=selection.cell, variant=selection.variant,
                                lock=selection.lock, sources=read_sources(ROOT / "templates"),
                                stackpin_version="0.1.0")).dockerfile


def add_image(engine: FakeEngine, cell: Cell, variant: str, lock_digest: str,
              **options: object) -> str:
    """A built image of ``cell`` in ``engine``, under the tags stackpin gives it."""
    tags = image_tags(cell, variant, lock_digest)  # type: ignore[arg-type]
    config = image_config(cell, variant, lock_digest, **options)  # type: ignore[arg-type]
    return engine.add(config, [layer_bytes(f"{cell.id}{variant}")], tags=tags)


def project(tmp_path: Path, *, report: bytes | None = b'{"summary": "ok"}\n') -> Path:
    """A project root that reuses the repository's templates and bundle skeleton."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "templates").symlink_to(ROOT / "templates")
    (root / "bundle").symlink_to(ROOT / "bundle")
    if report is not None:
        (root / "build" / "reports" / REPORT_DIR).mkdir(parents=True)
        (root / "build" / "reports" / REPORT_DIR / "report.json").write_bytes(report)
    return root


def record_cpu_build(root: Path, engine: FakeEngine, selection: bundle_format.Selection,
                     *, dockerfile: str | None = None) -> str:
    """What `stackpin build` and `stackpin verify` leave in ``root`` for the fake image:
    the build record with its Dockerfile, and the reports' image ID."""
    target = Target(cell=selection.cell, variant=selection.variant, lock=selection.lock,
                    layout=Layout(root))
    info = engine.image_info(target.tags[0])
    if info is None:  # nothing was built: nothing recorded
        return ""
    text = cpu_dockerfile(selection) if dockerfile is None else dockerfile
    record = BuildRecord(
        cell=selection.cell.id, variant=selection.variant, image_id=info.id, tags=target.tags,
        lock_digest=selection.lock.digest, seconds=1.0, steps=1, cached_steps=0,
        image_size=info.size, base_size=0, env_size=0, log_path="build.log",
        dockerfile_sha256=sha256_text(text), context_digest="c" * 64,
        base_reference=base_reference(selection.cell),
        base_id=base.id if (base := engine.image_info(base_reference(selection.cell))) else "",
    )
    write_record(target, record, text)
    if target.report_dir.is_dir():
        write_verified(target, info.id)
    return info.id


def cpu_selection(cells: dict[str, Cell]) -> bundle_format.Selection:
    lock = read_lock(ROOT, CPU_CELL)
    assert lock is not None
    return bundle_format.Selection(cell=cells[CPU_CELL], variant="stable", lock=lock)


def engine_with_cpu(cells: dict[str, Cell], kind: str = "docker20",
                    **image_options: object) -> FakeEngine:
    """The CPU cell's base and its stable image, and the SBOM probe's answer to runs."""
    selection = cpu_selection(cells)
    engine = FakeEngine(run_stdout=PROBE_OUTPUT + "\n", kind=kind)
    engine.add({"created": "2025-01-01T00:00:00Z"}, [b"base rootfs"],
               tags=(base_reference(selection.cell),))
    labels = {LABEL_DOCKERFILE_SHA256: sha256_text(cpu_dockerfile(selection)),
              **image_options.pop("labels", {})}  # type: ignore[dict-item]
    add_image(engine, selection.cell, "stable", selection.lock.digest, labels=labels,
              **image_options)
    return engine


def export_cpu(tmp_path: Path, cells: dict[str, Cell], *, name: str = "bundle",
               sign: bool = True, engine: FakeEngine | None = None, **options: object
               ) -> tuple[exporting.ExportResult, Path | None]:
    keys = tmp_path / "keys"
    if sign and not (keys / "stackpin.key").exists():
        signing.generate(keys)
    public = keys / "stackpin.pub" if sign else None
    root = tmp_path / "project" if (tmp_path / "project").exists() else project(tmp_path)
    engine = engine or engine_with_cpu(cells)
    selection = cpu_selection(cells)
    if not Layout(root).record_path(CPU_CELL, "stable").exists():
        record_cpu_build(root, engine, selection)
    request = bundle_format.ExportRequest(
        selections=(selection,), out_dir=tmp_path / "out" / name, root=root,
        signer=signing.Signer.load(keys / "stackpin.key") if sign else None,
        **options,  # type: ignore[arg-type]
    )
    return exporting.export(engine, request), public


def site_trusting(public: Path | None) -> trust.Trust:
    """The site's trust as `--pubkey public` gives it."""
    assert public is not None
    return trust.trusted_key(public, "--pubkey")


def resign(out: Path, manifest: dict[str, object] | bytes, keys: Path) -> None:
    """Write ``manifest`` and sign it with the real key: a compromised build host's view."""
    data = manifest if isinstance(manifest, bytes) else bundle_format.manifest_bytes(manifest)
    (out / "manifest.json").write_bytes(data)
    key = signing.load_private(keys / "stackpin.key")
    (out / "manifest.sig").write_bytes(signing.sign(data, key))
