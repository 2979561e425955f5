"""Secrets never travel: image configs and bundle files are scanned before export."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from stackpin.bundle.format import IMAGES
from stackpin.engine import ImageInfo
from stackpin.errors import BundleError

# --- secrets ----------------------------------------------------------------------------

_SECRET_TEXT: tuple[tuple[str, re.Pattern[bytes]], ...] = (
    ("a private key", re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("an AWS access key", re.compile(rb"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(rb"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_\w{22,})")),
    ("a Hugging Face token", re.compile(rb"\bhf_[A-Za-z0-9]{30,}\b")),
    ("a Slack token", re.compile(rb"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a password or token assignment", re.compile(
        rb"(?i)\b(?:password|passwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)\b"
        rb"[\"']?\s*[:=]\s*[\"']?[^\s\"'$]{4,}")),
    ("credentials in a URL", re.compile(rb"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
)
_SECRET_NAME = re.compile(
    r"(?:^|[_.-])(?:PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
    r"|CREDENTIALS?|AUTH)(?:$|[_.-])",
    re.IGNORECASE,
)


def find_secret(data: bytes) -> str | None:
    """What kind of secret ``data`` holds (never the secret itself), or None."""
    for kind, pattern in _SECRET_TEXT:
        if pattern.search(data):
            return kind
    return None


def scan_image_config(info: ImageInfo, *, name: str) -> None:
    """Refuse an image whose environment or labels carry a secret."""
    items = [("environment variable", *e.partition("=")[::2]) for e in info.env]
    items += [("label", k, v) for k, v in info.labels.items()]
    for where, key, value in items:
        kind = find_secret(f"{key}={value}".encode())
        if value and _SECRET_NAME.search(key):
            kind = kind or "a credential-named setting"
        if kind:
            msg = (
                f"image {name}: {where} {key} holds {kind}; a bundle never carries secrets: "
                "pass it at run time instead, rebuild, and export again"
            )
            raise BundleError(msg)


def scan_files(folder: Path, paths: Iterable[str]) -> None:
    """Refuse when a bundle file (images and wheels aside: binary) holds a secret."""
    for rel in paths:
        if rel == IMAGES or rel.endswith(".whl"):
            continue
        kind = find_secret((folder / rel).read_bytes())
        if kind:
            msg = (
                f"{rel} holds {kind}; a bundle never carries secrets: remove it from its "
                "source (build/reports/, the lock, the matrix) and export again"
            )
            raise BundleError(msg)


