"""Base resolution without Docker: the mmdebstrap recipe, its digest, the cache, the archive."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import signal
import tarfile
import threading
import time
from pathlib import Path

import pytest
from tests.fake_engine import FakeEngine, archive_members

from stackpin.bootstrap import (
    DIGEST_LABEL,
    BootstrapRequest,
    base_reference,
    bootstrap_image,
    bootstrap_request,
    ensure_base,
    image_config,
    mmdebstrap_argv,
    mmdebstrap_env,
    request_digest,
    rootfs_path,
)
from stackpin.engine import ImageInfo, SaveRequest
from stackpin.errors import BuildError, ConfigurationError, HostEnvironmentError, ValidationError
from stackpin.matrix import Base, Cell
from stackpin.matrixfile import load_cells

PINNING = Path(__file__).resolve().parents[2] / "pinning"
CPU_CELL = "cpu-bookworm-torch2130-py311"


@pytest.fixture(scope="module")
def cells() -> dict[str, Cell]:
    return load_cells(sorted(PINNING.glob("*.toml")))


@pytest.fixture
def cpu(cells) -> Cell:
    return cells[CPU_CELL]


@pytest.fixture
def request_(cpu) -> BootstrapRequest:
    return bootstrap_request(cpu)


def engine_with(images: dict[str, ImageInfo] | None = None) -> FakeEngine:
    """The shared fake holding ``images`` by reference (their content does not matter)."""
    engine = FakeEngine()
    for reference, info in (images or {}).items():
        engine.put(dataclasses.replace(info, tags=(reference,)))
    return engine


def _info(image_id: str) -> ImageInfo:
    return ImageInfo(id=image_id, tags=(), repo_digests=(), labels={}, size=0, created="",
                     env=(), entrypoint=(), cmd=(), diff_ids=(), architecture="amd64", os="linux")


def test_cpu_cell_gives_the_pinned_request(request_):
    assert request_ == BootstrapRequest(
        suite="bookworm",
        mirror="http://deb.debian.org/debian",
        packages=("ca-certificates", "python3", "python3-venv"),
        variant="minbase",
        source_date_epoch=1735689600,
        architecture="amd64",
    )


def test_mmdebstrap_argv_is_exact(request_):
    argv = mmdebstrap_argv(request_, Path("/cache/rootfs.tar"))

    assert argv == [
        "mmdebstrap",
        "--variant=minbase",
        "--architectures=amd64",
        "--format=tar",
        "--hook-dir=/usr/share/mmdebstrap/hooks/maybe-merged-usr",
        "--include=ca-certificates,python3,python3-venv",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        '--customize-hook=find "$1/var/log" -type f -exec truncate --size=0 {} +',
        '--customize-hook=find "$1/var/cache/apt" "$1/var/lib/apt/lists" -type f -delete',
        '--customize-hook=rm -f "$1/var/cache/ldconfig/aux-cache" "$1/var/lib/dbus/machine-id"'
        ' "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old'
        ' "$1/etc/hostname" "$1/etc/resolv.conf"',
        '--customize-hook=if [ -e "$1/etc/machine-id" ]; then : > "$1/etc/machine-id"; fi',
        '--customize-hook=find "$1/usr" -depth -type d -name __pycache__ -exec rm -rf {} +',
        "bookworm",
        "/cache/rootfs.tar",
        "http://deb.debian.org/debian",
    ]
    assert mmdebstrap_env(request_) == {"SOURCE_DATE_EPOCH": "1735689600"}


def test_digest_is_stable_and_ignores_package_order(cpu, request_):
    spec = cpu.base.bootstrap
    shuffled = dataclasses.replace(
        cpu,
        base=Base(bootstrap=dataclasses.replace(spec, packages=("python3-venv", "python3",
                                                                "ca-certificates", "python3"))),
    )

    assert request_digest(request_) == request_digest(bootstrap_request(cpu))
    assert request_digest(bootstrap_request(shuffled)) == request_digest(request_)
    assert base_reference(request_) == f"stackpin/base-bookworm:{request_digest(request_)[:12]}"


@pytest.mark.parametrize(
    "change",
    [
        {"source_date_epoch": 1735689601},
        {"mirror": "http://snapshot.debian.org/archive/debian/20250520T000000Z"},
        {"packages": ("python3",)},
        {"suite": "trixie"},
        {"architecture": "arm64"},
    ],
)
def test_every_input_changes_the_digest(request_, change):
    assert request_digest(dataclasses.replace(request_, **change)) != request_digest(request_)


def test_image_base_has_no_bootstrap_request(cells):
    dtk = next(c for c in cells.values() if c.platform == "dtk")

    with pytest.raises(ConfigurationError, match="has an image base"):
        bootstrap_request(dtk)


def test_image_config_is_canonical_and_dated_by_source_date_epoch(request_):
    raw = image_config(request_, diff_id="sha256:" + "ab" * 32)
    config = json.loads(raw)

    assert raw == json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    assert config["created"] == "2025-01-01T00:00:00Z"
    assert config["history"][0]["created"] == "2025-01-01T00:00:00Z"
    assert "LANG=C.UTF-8" in config["config"]["Env"]
    assert config["config"]["Cmd"] == ["/bin/bash"]
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + "ab" * 32]}


def _cache_rootfs(req: BootstrapRequest, cache_dir: Path) -> bytes:
    """A real (tiny) rootfs tar at the cache path, as an earlier mmdebstrap run leaves it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        payload = b"bookworm\n"
        info = tarfile.TarInfo("./etc/debian_version")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    path = rootfs_path(req, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_cached_rootfs_is_loaded_without_mmdebstrap(request_, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # mmdebstrap cannot be found
    rootfs = _cache_rootfs(request_, tmp_path / "cache")
    engine = engine_with()
    lines: list[str] = []

    reference = bootstrap_image(engine, request_, cache_dir=tmp_path / "cache", on_line=lines.append)

    assert reference == base_reference(request_)
    archive = archive_members(engine.loaded[0])
    manifest = json.loads(archive["manifest.json"])
    diff_id = f"sha256:{hashlib.sha256(rootfs).hexdigest()}"
    assert manifest[0]["RepoTags"] == [reference]
    assert archive[manifest[0]["Layers"][0]] == rootfs
    assert json.loads(archive[manifest[0]["Config"]])["rootfs"]["diff_ids"] == [diff_id]
    assert lines[0].startswith("base: reusing the cached rootfs")
    assert lines[-1].startswith(f"base: loaded {reference}")


def test_same_rootfs_gives_the_same_image_id(request_, tmp_path):
    _cache_rootfs(request_, tmp_path / "a")
    _cache_rootfs(request_, tmp_path / "b")
    first, second = engine_with(), engine_with()

    bootstrap_image(first, request_, cache_dir=tmp_path / "a")
    bootstrap_image(second, request_, cache_dir=tmp_path / "b")

    reference = base_reference(request_)
    assert first.image_info(reference).id == second.image_info(reference).id


def test_loaded_image_skips_everything(request_, tmp_path):
    loaded = dataclasses.replace(
        _info("sha256:" + "22" * 32), labels={DIGEST_LABEL: request_digest(request_)}
    )
    engine = engine_with({base_reference(request_): loaded})
    lines: list[str] = []

    reference = bootstrap_image(engine, request_, cache_dir=tmp_path, on_line=lines.append)

    assert reference == base_reference(request_)
    assert engine.loaded == []
    assert lines == [f"base: {reference} is already loaded; reusing it"]


def test_a_tag_pointing_at_another_image_is_replaced_from_the_cache(request_, tmp_path):
    _cache_rootfs(request_, tmp_path)
    engine = engine_with({base_reference(request_): _info("sha256:" + "77" * 32)})

    bootstrap_image(engine, request_, cache_dir=tmp_path)

    assert len(engine.loaded) == 1
    assert engine.image_info(base_reference(request_)).id != "sha256:" + "77" * 32


def test_missing_mmdebstrap_says_how_to_install_it(request_, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))

    with pytest.raises(HostEnvironmentError) as caught:
        bootstrap_image(engine_with(), request_, cache_dir=tmp_path / "cache")

    assert caught.value.message == "mmdebstrap not found: apt-get install mmdebstrap"
    assert caught.value.return_code == 8


def test_failed_mmdebstrap_keeps_its_log_and_leaves_no_partial_tar(request_, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in that fails like mmdebstrap does when the mirror lacks a package.
    script = bin_dir / "mmdebstrap"
    script.write_text("#!/bin/sh\necho 'E: Unable to locate package python3-venv' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    cache = tmp_path / "cache"

    with pytest.raises(BuildError) as caught:
        bootstrap_image(engine_with(), request_, cache_dir=cache)

    error = caught.value
    assert error.step == "mmdebstrap"
    assert "Unable to locate package python3-venv" in Path(error.log_path).read_text()
    assert "\n" not in error.message
    assert sorted(p.name for p in cache.iterdir()) == [Path(error.log_path).name]


def _image_cell(cells, digest: str) -> Cell:
    dtk = next(c for c in cells.values() if c.platform == "dtk")
    return dataclasses.replace(dtk, base=Base(image=dtk.base.image, digest=digest))


def test_present_image_base_matching_its_pin_is_used(cells, tmp_path):
    cell = _image_cell(cells, "sha256:" + "33" * 32)
    engine = engine_with({cell.base.image: _info("sha256:" + "33" * 32)})

    resolved = ensure_base(engine, cell, cache_dir=tmp_path)

    assert (resolved.reference, resolved.origin) == (cell.base.image, "local")
    assert engine.pulled == []


def test_image_base_with_another_digest_is_refused(cells, tmp_path):
    cell = _image_cell(cells, "sha256:" + "33" * 32)
    engine = engine_with({cell.base.image: _info("sha256:" + "44" * 32)})

    with pytest.raises(ValidationError) as caught:
        ensure_base(engine, cell, cache_dir=tmp_path)

    assert "sha256:" + "44" * 32 in caught.value.message
    assert "pins sha256:" + "33" * 32 in caught.value.message


def test_missing_image_base_is_pulled_and_an_unpinned_one_is_reported(cells, tmp_path):
    cell = _image_cell(cells, "")
    engine = engine_with()
    lines: list[str] = []

    resolved = ensure_base(engine, cell, cache_dir=tmp_path, on_line=lines.append)

    assert engine.pulled == [cell.base.image]
    assert resolved.origin == "pull"
    assert lines[-1].startswith(f"base: {cell.base.image} is sha256:")
    assert "pin it with base.digest" in lines[-1]


def _saved_tar(path: Path, *, tags: tuple[str, ...], by_id: bool) -> str:
    """A `docker save` tar of one image, saved by tag or by ID; returns the image's ID."""
    source = FakeEngine()
    image_id = source.add({"created": "2025-01-01T00:00:00Z"}, [b"vendor rootfs"], tags=tags)
    names = (image_id,) if by_id else tags
    path.write_bytes(b"".join(source.save(SaveRequest(images=names))))
    return image_id


def test_base_tar_saved_by_id_is_tagged_when_it_is_the_pinned_image(cells, tmp_path):
    tar = tmp_path / "base.tar"
    cell = _image_cell(cells, "")
    pinned = _saved_tar(tar, tags=(cell.base.image,), by_id=True)
    cell = _image_cell(cells, pinned)
    engine = FakeEngine()

    resolved = ensure_base(engine, cell, cache_dir=tmp_path, base_tar=tar)

    assert engine.tags == {cell.base.image: pinned}
    assert (resolved.image_id, resolved.origin) == (pinned, "tar")


def test_base_tar_holding_another_image_is_refused(cells, tmp_path):
    cell = _image_cell(cells, "sha256:" + "55" * 32)
    tar = tmp_path / "base.tar"
    _saved_tar(tar, tags=("other/image:1",), by_id=False)

    with pytest.raises(ValidationError, match=r"holds other/image:1, not "):
        ensure_base(FakeEngine(), cell, cache_dir=tmp_path, base_tar=tar)


def test_missing_base_tar_names_the_file(cells, tmp_path):
    cell = _image_cell(cells, "")

    with pytest.raises(HostEnvironmentError, match=r"base tar .*nope.tar does not exist"):
        ensure_base(engine_with(), cell, cache_dir=tmp_path, base_tar=tmp_path / "nope.tar")


def test_base_tar_is_refused_for_a_bootstrap_cell(cpu, tmp_path):
    with pytest.raises(ConfigurationError, match="bootstraps its base"):
        ensure_base(engine_with(), cpu, cache_dir=tmp_path, base_tar=tmp_path / "x.tar")


def test_ctrl_c_lets_mmdebstrap_clean_up_and_leaves_no_tar(request_, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started, cleaned = tmp_path / "started", tmp_path / "cleaned"
    # Like mmdebstrap: on TERM it tears down its chroot (here: leaves a mark) and exits.
    script = bin_dir / "mmdebstrap"
    script.write_text(
        "#!/bin/sh\n"
        f"trap 'echo unmounted > {cleaned}; exit 143' TERM\n"
        f"touch {started}\n"
        "sleep 300 &\nwait $!\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    cache = tmp_path / "cache"

    def press_ctrl_c() -> None:
        deadline = time.monotonic() + 60  # guard only: never hang the suite
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        # A real SIGINT to the main thread, which is blocked waiting for the child.
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    # A runner that started pytest with SIGINT ignored (a background job of a
    # non-interactive shell) would swallow the key press: take it as Python does by default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    presser = threading.Thread(target=press_ctrl_c)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            bootstrap_image(engine_with(), request_, cache_dir=cache)
    finally:
        signal.signal(signal.SIGINT, previous)
    presser.join()

    assert cleaned.read_text() == "unmounted\n"
    assert not rootfs_path(request_, cache).exists()
    assert [p.name for p in cache.iterdir() if p.suffix != ".log"] == []
