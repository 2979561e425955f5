"""Which key the site trusts, and the signature check that fails closed.

The key always comes from the site, never from the bundle. In order of precedence:

1. ``--pubkey FILE`` on the command line;
2. the environment variable ``STACKPIN_PUBKEY`` (a file path);
3. the site trust file ``/etc/stackpin/trusted.pub``.

With none of them, or with a bundle whose ``manifest.sig`` is absent, malformed or made
by another key, verify, inspect and load refuse. The only way past is the explicit
opt-out ``--insecure-unsigned`` (or ``STACKPIN_INSECURE_UNSIGNED=1``), and every line
printed then says the signature was not checked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from stackpin import signing
from stackpin.bundle.format import MANIFEST, SIGNATURE, SignatureState
from stackpin.errors import BundleError
from stackpin.untrusted import shown

PUBKEY_ENV = "STACKPIN_PUBKEY"
INSECURE_ENV = "STACKPIN_INSECURE_UNSIGNED"
SITE_TRUST_FILE = Path("/etc/stackpin/trusted.pub")
INSECURE_NOTE = "INSECURE: signature not checked (--insecure-unsigned)"


@dataclass(frozen=True, kw_only=True)
class Trust:
    """The site's decision: a trusted key (and where it came from), or the opt-out."""

    key: Ed25519PublicKey | None
    origin: str
    insecure: bool = False

    @property
    def fingerprint(self) -> str | None:
        return signing.fingerprint(self.key) if self.key is not None else None


def trusted_key(path: Path, origin: str) -> Trust:
    return Trust(key=signing.load_public(path), origin=f"{origin} {shown(path)}")


def insecure() -> Trust:
    return Trust(key=None, origin="none", insecure=True)


def resolve(pubkey: Path | None, *, insecure_unsigned: bool = False,
            environ: Mapping[str, str] | None = None,
            site_file: Path | None = None) -> Trust:
    """The key in the order of precedence above, or the explicit opt-out, or an error."""
    env = os.environ if environ is None else environ
    flag = env.get(INSECURE_ENV, "")
    if flag not in ("", "0", "1"):
        msg = (f"{INSECURE_ENV}={shown(flag, limit=20)!r}: set it to 1 to skip the signature "
               "check, or unset it")
        raise BundleError(msg)
    if insecure_unsigned or flag == "1":
        return insecure()
    if pubkey is not None:
        return trusted_key(pubkey, "--pubkey")
    if env.get(PUBKEY_ENV):
        return trusted_key(Path(env[PUBKEY_ENV]), PUBKEY_ENV)
    site = SITE_TRUST_FILE if site_file is None else site_file
    if site.exists():
        return trusted_key(site, "site trust file")
    msg = (
        f"no trusted key: pass --pubkey stackpin.pub (received from the build host by a "
        f"separate channel), set {PUBKEY_ENV}, or install it as {SITE_TRUST_FILE}; "
        f"--insecure-unsigned skips the signature check"
    )
    raise BundleError(msg)


def check(source: Path, data: bytes, signature: bytes | None, trust: Trust) -> SignatureState:
    """Verify ``signature`` over the exact manifest bytes before any field is read."""
    if trust.insecure:
        return "not checked (insecure)"
    assert trust.key is not None
    if signature is None:
        msg = (f"{shown(source)}: {SIGNATURE} is missing: refusing an unsigned bundle "
               f"(the site trusts {trust.origin}); nothing was loaded")
        raise BundleError(msg)
    signing.verify(data, signature, trust.key, what=f"{shown(source)}: {MANIFEST}")
    return "verified"
