"""ed25519 keys and manifest signatures (also checked by OpenSSL, as the site does)."""

from __future__ import annotations

import stat
import subprocess

import pytest
from tests.tools import need_tool

from stackpin import signing
from stackpin.errors import BundleError


def test_generate_writes_a_private_key_readable_only_by_its_owner(tmp_path):
    pair = signing.generate(tmp_path / "keys")
    assert stat.S_IMODE(pair.private_path.stat().st_mode) == 0o600
    assert pair.private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert pair.public_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    assert pair.fingerprint.startswith("ed25519:")
    assert len(pair.fingerprint) == len("ed25519:") + 64


def test_generate_never_overwrites_silently(tmp_path):
    first = signing.generate(tmp_path)
    with pytest.raises(BundleError, match="exists: keep it"):
        signing.generate(tmp_path)
    assert signing.generate(tmp_path, force=True).fingerprint != first.fingerprint


def test_signatures_are_deterministic_and_verify(tmp_path):
    pair = signing.generate(tmp_path)
    key = signing.load_private(pair.private_path)
    data = b'{"format": "stackpin-bundle"}\n'
    assert signing.sign(data, key) == signing.sign(data, key)
    public = signing.load_public(pair.public_path)
    signing.verify(data, signing.sign(data, key), public, what="b")
    with pytest.raises(BundleError, match="edited after signing"):
        signing.verify(data + b" ", signing.sign(data, key), public, what="b")
    with pytest.raises(BundleError, match="signature is 3 bytes"):
        signing.verify(data, b"abc", public, what="b")


def test_a_private_key_open_to_others_is_refused(tmp_path):
    pair = signing.generate(tmp_path)
    pair.private_path.chmod(0o644)
    with pytest.raises(BundleError, match="chmod 600"):
        signing.load_private(pair.private_path)


def test_a_key_of_another_kind_is_refused(tmp_path):
    path = tmp_path / "not-a-key"
    path.write_text("hello")
    with pytest.raises(BundleError, match="stackpin keys generate"):
        signing.load_private(path)
    with pytest.raises(BundleError, match=r"stackpin\.pub of the signer"):
        signing.load_public(path)


def test_openssl_verifies_what_stackpin_signs(tmp_path):
    need_tool("openssl")
    pair = signing.generate(tmp_path)
    data = tmp_path / "manifest.json"
    data.write_bytes(b'{"a": 1}\n')
    sig = tmp_path / "manifest.sig"
    sig.write_bytes(signing.sign(data.read_bytes(), signing.load_private(pair.private_path)))
    argv = ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(pair.public_path),
            "-rawin", "-in", str(data), "-sigfile", str(sig)]
    assert subprocess.run(argv, capture_output=True).returncode == 0
    data.write_bytes(b'{"a": 2}\n')
    assert subprocess.run(argv, capture_output=True).returncode != 0
