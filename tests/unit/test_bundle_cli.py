"""`stackpin keys` and `stackpin bundle inspect|verify` through the CLI (no daemon needed)."""

from __future__ import annotations

import json
import stat

from click.testing import CliRunner
from test_bundle_fakes import CPU_CELL, export_cpu

from stackpin.cli.main import cli


def test_keys_generate_prints_the_fingerprint_and_refuses_to_overwrite(tmp_path):
    runner = CliRunner()
    done = runner.invoke(cli, ["keys", "generate", "-o", str(tmp_path), "--json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert data["fingerprint"].startswith("ed25519:")
    assert stat.S_IMODE((tmp_path / "stackpin.key").stat().st_mode) == 0o600
    again = runner.invoke(cli, ["keys", "generate", "-o", str(tmp_path)])
    assert again.exit_code == 7
    assert "--force" in again.output


def test_bundle_verify_and_inspect_json(tmp_path, shipped_cells):
    result, public = export_cpu(tmp_path, shipped_cells, archive=True)
    runner = CliRunner()
    for source in (result.out_dir, result.archive):
        done = runner.invoke(cli, ["bundle", "verify", str(source), "--pubkey", str(public),
                                   "--json"])
        assert done.exit_code == 0, done.output
        data = json.loads(done.output)
        assert (data["ok"], data["signature"]) == (True, "verified")
        assert data["images"][0]["cell"] == CPU_CELL
    done = runner.invoke(cli, ["bundle", "inspect", str(result.archive), "--json"])
    assert done.exit_code == 0
    assert json.loads(done.output)["images"][0]["profile"] == "stable"
    done = runner.invoke(cli, ["bundle", "inspect", str(result.out_dir)])
    assert "127.0.0.1:18888" in done.output


def test_bundle_verify_of_a_tampered_bundle_exits_7_with_one_line(tmp_path, shipped_cells):
    result, public = export_cpu(tmp_path, shipped_cells)
    path = result.out_dir / "images.tar.zst"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    done = CliRunner().invoke(cli, ["bundle", "verify", str(result.out_dir), "--pubkey",
                                    str(public)])
    assert done.exit_code == 7
    lines = done.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("stackpin: bundle error: ")
    assert "images.tar.zst does not match its sha256" in lines[0]
