"""Locks and the wheelhouse: what gets locked, what is refused, and the fetch seam."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import tomllib

from stackpin.errors import HostEnvironmentError, ValidationError
from stackpin.lock import build_lock, parse_lock, stale_reason
from stackpin.matrix import decode_matrix
from stackpin.wheelhouse import (
    fetch,
    pip_download_argv,
    require_complete,
    scan,
    target_platforms,
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
[cells.k.stack]
numpy = "1.26.4"
peft = "0.17.1"
"""
    return decode_matrix(tomllib.loads(text), source="t").cells["k"]


def wheelhouse(root: Path, files: dict[str, bytes]) -> None:
    (root / "wheels" / "k").mkdir(parents=True, exist_ok=True)
    (root / "wheels" / "vendor").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        folder = "vendor" if name in (TORCH, FLASH) else "k"
        (root / "wheels" / folder / name).write_bytes(data)


def listing() -> dict[str, str]:
    return {TORCH: sha(b"t"), FLASH: sha(b"f"), NUMPY: sha(b"n"), PEFT: sha(b"p")}


def test_lock_groups_layers_in_install_order():
    lock = build_lock(make_cell(), listing(), base_reference="dtk:26.04")
    assert [(w.group, w.name) for w in lock.wheels] == [
        ("vendor", "torch"), ("stack", "numpy"), ("stack", "peft"), ("attention", "flash-attn"),
    ]
    assert lock.wheels[0].version == "2.9.0+das.opt1.dtk2604"
    assert lock.complete


def test_lock_text_and_digest_are_deterministic_and_round_trip():
    a = build_lock(make_cell(), listing(), base_reference="b")
    b = build_lock(make_cell(), dict(reversed(list(listing().items()))), base_reference="b")
    assert a.text() == b.text()
    assert a.digest == b.digest == sha(a.text().encode())
    assert parse_lock(a.text(), source="x") == a


def test_pinned_hash_mismatch_names_file_and_both_digests():
    cell = make_cell(torch_sha="0" * 64)
    with pytest.raises(ValidationError) as info:
        build_lock(cell, listing(), base_reference="b")
    assert TORCH in info.value.message
    assert sha(b"t") in info.value.message
    assert "0" * 64 in info.value.message


def test_missing_vendor_wheel_makes_an_incomplete_lock():
    files = listing()
    del files[FLASH]
    lock = build_lock(make_cell(), files, base_reference="b")
    assert lock.missing == (FLASH,)
    assert not lock.complete


def test_two_versions_of_one_distribution_are_refused():
    files = {**listing(), "peft-0.17.0-py3-none-any.whl": sha(b"q")}
    with pytest.raises(ValidationError, match="keep one version per distribution"):
        build_lock(make_cell(), files, base_reference="b")


def test_stack_pin_missing_from_wheelhouse_says_fetch():
    files = listing()
    del files[PEFT]
    with pytest.raises(ValidationError, match=r"peft==0.17.1 is pinned .* 'stackpin wheels fetch k'"):
        build_lock(make_cell(), files, base_reference="b")


def test_attention_wheel_ignored_when_no_enhanced_variant():
    cell = make_cell(variants='["stable"]')
    lock = build_lock(cell, listing(), base_reference="b")
    assert all(w.group != "attention" for w in lock.wheels)


def test_edited_cell_makes_the_lock_stale():
    cell = make_cell()
    lock = build_lock(cell, listing(), base_reference="b")
    assert stale_reason(lock, cell) is None
    edited = dataclasses.replace(cell, numpy="<1.27")
    assert stale_reason(lock, edited) == "the cell changed since the lock was written"


def test_malformed_lock_is_a_configuration_error():
    from stackpin.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="not a stackpin lock"):
        parse_lock(json.dumps({"lock_version": 1}), source="x.lock")


def test_flipped_byte_in_wheelhouse_is_named_with_both_digests(tmp_path: Path):
    files = {TORCH: b"t", FLASH: b"f", NUMPY: b"n", PEFT: b"p"}
    wheelhouse(tmp_path, files)
    cell = make_cell(torch_sha=sha(b"t"), flash_sha=sha(b"f"))
    lock = build_lock(cell, scan(cell, tmp_path), base_reference="b")
    assert verify_wheelhouse(lock, tmp_path) == []
    (tmp_path / "wheels" / "k" / NUMPY).write_bytes(b"N")
    (mismatch,) = verify_wheelhouse(lock, tmp_path)
    assert str(mismatch) == f"{NUMPY}: sha256 {sha(b'N')}, the lock expects {sha(b'n')}"
    with pytest.raises(ValidationError, match="wheelhouse does not match the lock"):
        require_complete(lock, cell, tmp_path)


def test_scan_names_missing_vendor_file_cell_and_folder(tmp_path: Path):
    wheelhouse(tmp_path, {NUMPY: b"n"})
    with pytest.raises(HostEnvironmentError) as info:
        scan(make_cell(), tmp_path)
    assert TORCH in info.value.message
    assert "for cell k" in info.value.message
    assert str(tmp_path / "wheels" / "vendor") in info.value.message


def test_target_platforms_cover_the_glibc_floor_only():
    tags = target_platforms(make_cell())
    assert tags[0] == "manylinux_2_35_x86_64"
    assert "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags
    assert "manylinux_2_36_x86_64" not in tags


def test_pip_download_is_for_the_cell_not_the_host(tmp_path: Path):
    argv = pip_download_argv(make_cell(), dest=tmp_path, requirements=tmp_path / "r.txt",
                             with_deps=False, python="py")
    assert argv[:4] == ["py", "-m", "pip", "download"]
    assert argv[argv.index("--python-version") + 1] == "3.10"
    assert "--only-binary=:all:" in argv
    assert argv[-2:] == ["--no-deps", "--require-hashes"]


def test_fetch_swaps_in_the_download_and_locks_it(tmp_path: Path):
    wheelhouse(tmp_path, {TORCH: b"t", FLASH: b"f", "old-1.0-py3-none-any.whl": b"o"})
    cell = make_cell(torch_sha=sha(b"t"), flash_sha=sha(b"f"))
    seen: list[list[str]] = []

    def fake_pip(argv: list[str], on_line) -> int:
        seen.append(argv)
        dest = Path(argv[argv.index("--dest") + 1])
        requirements = Path(argv[argv.index("-r") + 1]).read_text()
        assert str(tmp_path / "wheels" / "vendor" / TORCH) in requirements
        assert "peft==0.17.1" in requirements
        for name, data in ((NUMPY, b"n"), (PEFT, b"p"), (TORCH, b"t")):
            (dest / name).write_bytes(data)
        on_line("Saved")
        return 0

    result = fetch(cell, tmp_path, base_reference="b", runner=fake_pip)
    assert result.mode == "resolved"
    assert sorted(p.name for p in (tmp_path / "wheels" / "k").iterdir()) == sorted([NUMPY, PEFT])
    assert {w.filename for w in result.lock.wheels} == {TORCH, FLASH, NUMPY, PEFT}
    assert "--no-deps" not in seen[0]


def test_failed_fetch_keeps_the_old_wheelhouse(tmp_path: Path):
    wheelhouse(tmp_path, {TORCH: b"t", FLASH: b"f", NUMPY: b"n"})

    def failing_pip(argv: list[str], on_line) -> int:
        (Path(argv[argv.index("--dest") + 1]) / PEFT).write_bytes(b"half")
        return 1

    with pytest.raises(HostEnvironmentError, match="pip download failed for cell k"):
        fetch(make_cell(), tmp_path, base_reference="b", runner=failing_pip)
    assert [p.name for p in (tmp_path / "wheels" / "k").iterdir()] == [NUMPY]
    assert [p.name for p in (tmp_path / "wheels").iterdir() if p.name.startswith(".")] == []
