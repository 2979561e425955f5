"""Locks and the wheelhouse: what gets locked, what is refused, and the fetch seam."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import tomllib

from stackpin.errors import HostEnvironmentError, ValidationError
from stackpin.lock import lock_from_resolution, parse_lock, stale_reason
from stackpin.matrixfile import decode_matrix
from stackpin.resolve import Resolution, Resolved
from stackpin.wheelhouse import (
    fetch,
    pip_download_argv,
    require_complete,
    target_platforms,
    vendor_files_needed,
    verify_wheelhouse,
)

TORCH = "torch-2.9.0+das.opt1.dtk2604-cp310-cp310-manylinux_2_28_x86_64.whl"
FLASH = "flash_attn-2.8.3+das.opt1.dtk2604.torch290-cp310-cp310-manylinux_2_28_x86_64.whl"
NUMPY = "numpy-1.26.4-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
PEFT = "peft-0.17.1-py3-none-any.whl"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_cell(torch_sha: str = "", flash_sha: str = "", variants: str = '["stable", "enhanced"]'):
    text = f"""
schema_version = 1
[cells.k]
platform = "dtk"
platform_version = "26.04"
python = "cp310"
glibc = "2.35"
numpy = "<2"
variants = {variants}
env_script = "/opt/dtk/env.sh"
bitsandbytes = "disabled"
[cells.k.env]
UNSLOTH_DISABLE_BITSANDBYTES = "1"
[cells.k.base]
image = "dtk:26.04"
[cells.k.torch]
filename = "{TORCH}"
sha256 = "{torch_sha}"
[cells.k.attention]
filename = "{FLASH}"
sha256 = "{flash_sha}"
[cells.k.provided.torch]
version = "2.9.0+das.opt1.dtk2604"
[cells.k.provided.flash-attn]
version = "2.8.3+das.opt1.dtk2604.torch290"
[cells.k.stack]
numpy = "1.26.4"
peft = "0.17.1"
"""
    return decode_matrix(tomllib.loads(text), source="t").cells["k"]


def resolution(cell, *, peft: bytes = b"p", extra: tuple[Resolved, ...] = ()) -> Resolution:
    """What resolve_cell returns for make_cell(): two vendor files, two index wheels."""
    closure = [
        Resolved(name="torch", version="2.9.0+das.opt1.dtk2604", origin="vendor-wheel"),
        Resolved(name="numpy", version="1.26.4", origin="index", filename=NUMPY,
                 url=f"https://files.example/{NUMPY}", sha256=sha(b"n")),
        Resolved(name="peft", version="0.17.1", origin="index", filename=PEFT,
                 url=f"https://files.example/{PEFT}", sha256=sha(peft)),
        *extra,
    ]
    if "enhanced" in cell.variants:
        closure.append(Resolved(name="flash-attn", version="2.8.3+das.opt1.dtk2604.torch290",
                                origin="vendor-wheel"))
    return Resolution(cell=cell.id, key="k" * 64, closure=tuple(closure))


def lock_of(cell, **kwargs):
    return lock_from_resolution(cell, resolution(cell, **kwargs), base_reference="dtk:26.04")


def wheelhouse(root: Path, files: dict[str, bytes]) -> None:
    (root / "wheels" / "k").mkdir(parents=True, exist_ok=True)
    (root / "wheels" / "vendor").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        folder = "vendor" if name in (TORCH, FLASH) else "k"
        (root / "wheels" / folder / name).write_bytes(data)


def listing() -> dict[str, str]:
    return {TORCH: sha(b"t"), FLASH: sha(b"f"), NUMPY: sha(b"n"), PEFT: sha(b"p")}


def test_lock_groups_layers_in_install_order():
    lock = lock_of(make_cell(torch_sha=sha(b"t"), flash_sha=sha(b"f")))
    assert [(w.group, w.name) for w in lock.wheels] == [
        ("vendor", "torch"), ("stack", "numpy"), ("stack", "peft"), ("attention", "flash-attn"),
    ]
    assert lock.wheels[0].version == "2.9.0+das.opt1.dtk2604"
    assert lock.wheels[0].filename == TORCH and lock.wheels[0].sha256 == sha(b"t")
    assert lock.complete


def test_lock_records_where_each_distribution_comes_from():
    lock = lock_of(make_cell())
    origins = {w.name: (w.source, w.origin) for w in lock.wheels}
    assert origins["torch"] == ("vendor", f"vendor file wheels/vendor/{TORCH}")
    assert origins["numpy"] == ("index", f"https://files.example/{NUMPY}")


def test_lock_text_and_digest_are_deterministic_and_round_trip():
    a = lock_of(make_cell())
    b = lock_of(make_cell())
    assert a.text() == b.text()
    assert a.digest == b.digest == sha(a.text().encode())
    assert parse_lock(a.text(), source="x") == a


def test_unpinned_vendor_file_makes_an_incomplete_lock():
    lock = lock_of(make_cell(torch_sha=sha(b"t")))
    assert lock.missing == (FLASH,)
    assert not lock.complete


def test_attention_wheel_not_locked_when_no_enhanced_variant():
    cell = make_cell(variants='["stable"]')
    lock = lock_of(cell)
    assert all(w.group != "attention" for w in lock.wheels)


def test_base_image_distribution_is_recorded_not_installed():
    extra = (Resolved(name="torchvision", version="0.24.0+das.opt1.dtk2604",
                      origin="base-image"),)
    lock = lock_of(make_cell(), extra=extra)
    (base,) = lock.group("base")
    assert (base.name, base.source, base.origin) == ("torchvision", "base", "base image dtk:26.04")
    assert base not in lock.installed()


def test_edited_cell_makes_the_lock_stale():
    cell = make_cell()
    lock = lock_of(cell)
    assert stale_reason(lock, cell) is None
    edited = dataclasses.replace(cell, numpy="<1.27")
    assert stale_reason(lock, edited) == "the cell changed since the lock was written"


def test_malformed_lock_is_a_configuration_error():
    from stackpin.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="not a stackpin lock"):
        parse_lock(json.dumps({"lock_version": 2}), source="x.lock")


def test_flipped_byte_in_wheelhouse_is_named_with_both_digests(tmp_path: Path):
    files = {TORCH: b"t", FLASH: b"f", NUMPY: b"n", PEFT: b"p"}
    wheelhouse(tmp_path, files)
    cell = make_cell(torch_sha=sha(b"t"), flash_sha=sha(b"f"))
    lock = lock_of(cell)
    assert verify_wheelhouse(lock, tmp_path) == []
    (tmp_path / "wheels" / "k" / NUMPY).write_bytes(b"N")
    (mismatch,) = verify_wheelhouse(lock, tmp_path)
    assert str(mismatch) == f"{NUMPY}: sha256 {sha(b'N')}, the lock expects {sha(b'n')}"
    with pytest.raises(ValidationError, match="wheelhouse does not match the lock"):
        require_complete(lock, cell, tmp_path)


def test_build_refuses_an_unpinned_vendor_file_and_says_how_to_pin_it(tmp_path: Path):
    cell = make_cell(torch_sha=sha(b"t"))
    with pytest.raises(ValidationError) as info:
        require_complete(lock_of(cell), cell, tmp_path)
    assert f"sha256sum wheels/vendor/{FLASH}" in info.value.message


def test_vendor_files_needed_lists_name_version_and_presence(tmp_path: Path):
    wheelhouse(tmp_path, {TORCH: b"t"})
    needed = {v.filename: v for v in vendor_files_needed(lock_of(make_cell()), tmp_path)}
    assert set(needed) == {TORCH, FLASH}
    assert needed[TORCH].present and not needed[FLASH].present
    assert needed[FLASH].line() == (
        f"{FLASH} (flash-attn 2.8.3+das.opt1.dtk2604.torch290; sha256 not pinned; missing)")


def test_target_platforms_cover_the_glibc_floor_only():
    tags = target_platforms(make_cell())
    assert tags[0] == "manylinux_2_35_x86_64"
    assert "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags
    assert "manylinux_2_36_x86_64" not in tags


def test_pip_download_is_for_the_cell_not_the_host(tmp_path: Path):
    argv = pip_download_argv(make_cell(), dest=tmp_path, requirements=tmp_path / "r.txt",
                             python="py")
    assert argv[:4] == ["py", "-m", "pip", "download"]
    assert argv[argv.index("--python-version") + 1] == "3.10"
    assert "--only-binary=:all:" in argv
    assert argv[-2:] == ["--no-deps", "--require-hashes"]


def test_fetch_downloads_exactly_the_locked_index_wheels_never_vendor_files(tmp_path: Path):
    wheelhouse(tmp_path, {"old-1.0-py3-none-any.whl": b"o"})
    cell = make_cell()
    lock = lock_of(cell)
    seen: list[str] = []

    def fake_pip(argv: list[str], on_line) -> int:
        dest = Path(argv[argv.index("--dest") + 1])
        seen.append(Path(argv[argv.index("-r") + 1]).read_text())
        for name, data in ((NUMPY, b"n"), (PEFT, b"p")):
            (dest / name).write_bytes(data)
        return 0

    result = fetch(cell, tmp_path, lock, runner=fake_pip)
    assert seen == [f"numpy==1.26.4 --hash=sha256:{sha(b'n')}\n"
                    f"peft==0.17.1 --hash=sha256:{sha(b'p')}\n"]
    assert sorted(p.name for p in (tmp_path / "wheels" / "k").iterdir()) == sorted([NUMPY, PEFT])
    assert [v.filename for v in result.vendor] == [TORCH, FLASH]


def test_fetch_refuses_a_stale_lock(tmp_path: Path):
    cell = make_cell()
    lock = lock_of(cell)
    with pytest.raises(ValidationError, match="run 'stackpin lock k' first"):
        fetch(dataclasses.replace(cell, numpy="<1.27"), tmp_path, lock)


def test_failed_fetch_keeps_the_old_wheelhouse(tmp_path: Path):
    wheelhouse(tmp_path, {TORCH: b"t", FLASH: b"f", NUMPY: b"n"})

    def failing_pip(argv: list[str], on_line) -> int:
        (Path(argv[argv.index("--dest") + 1]) / PEFT).write_bytes(b"half")
        return 1

    cell = make_cell()
    with pytest.raises(HostEnvironmentError, match="pip download failed for cell k"):
        fetch(cell, tmp_path, lock_of(cell), runner=failing_pip)
    assert [p.name for p in (tmp_path / "wheels" / "k").iterdir()] == [NUMPY]
    assert [p.name for p in (tmp_path / "wheels").iterdir() if p.name.startswith(".")] == []


# --- the machine-wide wheel cache ----------------------------------------------------------


def _pip_writing(files: dict[str, bytes], asked: list[str]):
    def fake_pip(argv: list[str], on_line) -> int:
        dest = Path(argv[argv.index("--dest") + 1])
        asked.append(Path(argv[argv.index("-r") + 1]).read_text())
        for name, data in files.items():
            (dest / name).write_bytes(data)
        return 0
    return fake_pip


def test_fetch_keeps_downloads_in_the_cache_and_a_second_fetch_downloads_nothing(tmp_path: Path):
    cell, cache = make_cell(), tmp_path / "cache"
    lock = lock_of(cell)
    asked: list[str] = []
    first = fetch(cell, tmp_path / "a", lock, cache=cache,
                  runner=_pip_writing({NUMPY: b"n", PEFT: b"p"}, asked))
    assert first.cached == 0
    assert (cache / "wheels" / sha(b"p") / PEFT).read_bytes() == b"p"

    def no_pip(argv: list[str], on_line) -> int:
        msg = "pip ran although the cache holds every wheel"
        raise AssertionError(msg)

    second = fetch(cell, tmp_path / "b", lock, cache=cache, runner=no_pip)
    assert (second.cached, second.wheel_count) == (2, 2)
    assert (tmp_path / "b" / "wheels" / "k" / PEFT).read_bytes() == b"p"
    assert len(asked) == 1


def test_a_flipped_byte_in_the_cache_is_never_used_the_wheel_is_downloaded_again(tmp_path: Path):
    cell, cache = make_cell(), tmp_path / "cache"
    lock = lock_of(cell)
    fetch(cell, tmp_path / "a", lock, cache=cache,
          runner=_pip_writing({NUMPY: b"n", PEFT: b"p"}, []))
    # The wheelhouse shares the cached inode: a byte changed in either is changed in both.
    (tmp_path / "a" / "wheels" / "k" / PEFT).write_bytes(b"P")
    asked: list[str] = []
    result = fetch(cell, tmp_path / "b", lock, cache=cache,
                   runner=_pip_writing({PEFT: b"p"}, asked))
    assert asked == [f"peft==0.17.1 --hash=sha256:{sha(b'p')}\n"]
    assert result.cached == 1
    assert (tmp_path / "b" / "wheels" / "k" / PEFT).read_bytes() == b"p"
    assert (cache / "wheels" / sha(b"p") / PEFT).read_bytes() == b"p"


def test_fetch_without_a_cache_asks_pip_for_every_wheel(tmp_path: Path):
    cell, cache = make_cell(), tmp_path / "cache"
    lock = lock_of(cell)
    fetch(cell, tmp_path / "a", lock, cache=cache,
          runner=_pip_writing({NUMPY: b"n", PEFT: b"p"}, []))
    asked: list[str] = []
    result = fetch(cell, tmp_path / "b", lock, runner=_pip_writing({NUMPY: b"n", PEFT: b"p"},
                                                                     asked))
    assert result.cached == 0
    assert asked[0].count("--hash=sha256:") == 2


def test_a_cache_key_cannot_name_a_path_outside_the_cache(tmp_path: Path):
    from stackpin.wheelcache import entry

    for sha256, filename in (("../" * 3 + "x", PEFT), (sha(b"p"), "../../etc/passwd"),
                             (sha(b"p").upper(), PEFT), (sha(b"p"), "")):
        with pytest.raises(ValueError, match="not a wheel cache key"):
            entry(tmp_path, sha256, filename)
