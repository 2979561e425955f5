"""Ed25519 keys and signatures for bundle manifests.

The signature is over the exact bytes of ``manifest.json`` and is stored raw (64 bytes) in
``manifest.sig``, so a site without Python checks it with OpenSSL >= 1.1.1::

    openssl pkeyutl -verify -pubin -inkey stackpin.pub -rawin \\
        -in manifest.json -sigfile manifest.sig

Keys are PEM (PKCS#8 private key, SubjectPublicKeyInfo public key): the forms OpenSSL
reads. Ed25519 signatures are deterministic: the same manifest and key give the same
signature bytes (issue 7: a bundle's bytes change only when its inputs do).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from stackpin.errors import BundleError
from stackpin.lock import atomic_write
from stackpin.untrusted import read_bounded, shown

PRIVATE_NAME = "stackpin.key"
PUBLIC_NAME = "stackpin.pub"
SIGNATURE_BYTES = 64
MAX_KEY_BYTES = 64 << 10  # a PEM ed25519 key is ~120 bytes


@dataclass(frozen=True, kw_only=True)
class KeyPair:
    private_path: Path
    public_path: Path
    fingerprint: str


def fingerprint(public: Ed25519PublicKey) -> str:
    """``ed25519:`` + sha256 of the raw 32-byte public key (what the manifest records)."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"ed25519:{hashlib.sha256(raw).hexdigest()}"


def generate(out_dir: Path, *, force: bool = False) -> KeyPair:
    """Write a new key pair; the private key is created 0600 and never overwritten silently."""
    private_path, public_path = out_dir / PRIVATE_NAME, out_dir / PUBLIC_NAME
    existing = [p for p in (private_path, public_path) if p.exists()]
    if existing and not force:
        msg = (
            f"{existing[0]} exists: keep it (bundles signed with it verify against its "
            "public key) or pass --force to replace the pair"
        )
        raise BundleError(msg)
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(private_path, mode=0o600) as tmp:
        tmp.chmod(0o600)  # before the key bytes land in it
        tmp.write_bytes(private_pem)
    with atomic_write(public_path, mode=0o644) as tmp:
        tmp.write_bytes(public_pem)
    return KeyPair(
        private_path=private_path,
        public_path=public_path,
        fingerprint=fingerprint(key.public_key()),
    )


def load_private(path: Path) -> Ed25519PrivateKey:
    try:
        mode = path.stat().st_mode & 0o077
        data = read_bounded(path, limit=MAX_KEY_BYTES, what="signing key", error=BundleError)
        key = serialization.load_pem_private_key(data, password=None)
    except (OSError, ValueError, TypeError, BundleError) as exc:
        msg = f"cannot read the signing key {path} ({exc}); make one: `stackpin keys generate`"
        raise BundleError(msg) from None
    if not isinstance(key, Ed25519PrivateKey):
        msg = f"{path} is not an ed25519 key; create one with `stackpin keys generate`"
        raise BundleError(msg)
    if mode and os.name == "posix":
        msg = f"{path} is readable by group or others: run `chmod 600 {path}`"
        raise BundleError(msg)
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    data = read_bounded(path, limit=MAX_KEY_BYTES, what="public key", error=BundleError)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        msg = (f"cannot read the public key {shown(path)} ({shown(exc, limit=80)}); pass the "
               "stackpin.pub of the signer")
        raise BundleError(msg) from None
    if not isinstance(key, Ed25519PublicKey):
        msg = f"{path} is not an ed25519 public key; pass the stackpin.pub of the signer"
        raise BundleError(msg)
    return key


def sign(data: bytes, key: Ed25519PrivateKey) -> bytes:
    return key.sign(data)


@dataclass(frozen=True)
class Signer:
    """A private key read once (where the user named it): signs, and names the signer."""

    key: Ed25519PrivateKey

    @classmethod
    def load(cls, path: Path) -> Signer:
        return cls(load_private(path))

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key.public_key())

    def sign(self, data: bytes) -> bytes:
        return sign(data, self.key)


def verify(data: bytes, signature: bytes, public: Ed25519PublicKey, *, what: str) -> None:
    """Raise a one-line BundleError unless ``signature`` is the key's signature of ``data``."""
    if len(signature) != SIGNATURE_BYTES:
        msg = (
            f"{what}: signature is {len(signature)} bytes, not {SIGNATURE_BYTES}: the bundle "
            "was damaged or re-signed with another tool; get a fresh copy from the build host"
        )
        raise BundleError(msg)
    try:
        public.verify(signature, data)
    except InvalidSignature:
        msg = (
            f"{what}: the signature does not match manifest.json for key "
            f"{fingerprint(public)}: the manifest was edited after signing or signed with "
            "another key; do not load it"
        )
        raise BundleError(msg) from None
