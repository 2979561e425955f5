"""`stackpin keys` and `stackpin bundle inspect|verify` through the CLI (no daemon needed)."""

from __future__ import annotations

import json
import stat

import pytest
from click.testing import CliRunner
from test_bundle_fakes import CPU_CELL, export_cpu

from stackpin import signing
from stackpin.bundle import trust
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
    done = runner.invoke(cli, ["bundle", "inspect", str(result.archive), "--json",
                               "--pubkey", str(public)])
    assert done.exit_code == 0
    assert json.loads(done.output)["images"][0]["profile"] == "stable"
    done = runner.invoke(cli, ["bundle", "inspect", str(result.out_dir)],
                         env={"STACKPIN_PUBKEY": str(public)})
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


@pytest.mark.parametrize("verb", ["inspect", "verify", "load"])
def test_without_a_trusted_key_every_verb_refuses(tmp_path, shipped_cells, verb):
    result, _ = export_cpu(tmp_path, shipped_cells)
    done = CliRunner().invoke(cli, ["bundle", verb, str(result.out_dir)])
    assert done.exit_code == 7
    assert done.output.startswith("stackpin: bundle error: no trusted key: pass --pubkey")
    assert len(done.output.strip().splitlines()) == 1


def test_the_site_trust_file_is_the_last_resort_and_flags_win(tmp_path, shipped_cells,
                                                               monkeypatch):
    result, public = export_cpu(tmp_path, shipped_cells)
    other = signing.generate(tmp_path / "other")
    site_file = tmp_path / "etc" / "trusted.pub"
    site_file.parent.mkdir()
    site_file.write_bytes(public.read_bytes())
    monkeypatch.setattr(trust, "SITE_TRUST_FILE", site_file)
    runner = CliRunner()
    args = ["bundle", "verify", str(result.out_dir)]
    assert runner.invoke(cli, args).exit_code == 0  # the site file alone
    # The variable beats the file, and --pubkey beats the variable.
    env = {"STACKPIN_PUBKEY": str(other.public_path)}
    assert runner.invoke(cli, args, env=env).exit_code == 7
    assert runner.invoke(cli, [*args, "--pubkey", str(public)], env=env).exit_code == 0
    assert runner.invoke(cli, [*args, "--pubkey", str(other.public_path)]).exit_code == 7


def test_the_opt_out_passes_an_unsigned_bundle_and_every_line_says_so(tmp_path, shipped_cells):
    result, _ = export_cpu(tmp_path, shipped_cells, sign=False)
    runner = CliRunner()
    for args, env in ((["--insecure-unsigned"], {}), ([], {"STACKPIN_INSECURE_UNSIGNED": "1"})):
        for verb in ("verify", "inspect"):
            done = runner.invoke(cli, ["bundle", verb, str(result.out_dir), *args], env=env)
            assert done.exit_code == 0, done.output
            lines = done.output.strip().splitlines()
            assert lines
            assert all("INSECURE: signature not checked" in line for line in lines), lines
    done = runner.invoke(cli, ["bundle", "verify", str(result.out_dir), "--json",
                               "--insecure-unsigned"])
    data = json.loads(done.output)
    assert (data["insecure"], data["signature"]) == (True, "not checked (insecure)")
