"""``stackpin keys``: the ed25519 key pair that signs bundle manifests."""

from __future__ import annotations

from pathlib import Path

import click

from stackpin import signing
from stackpin.cli.common import echo_json, json_option


@click.group(name="keys")
def command() -> None:
    """Signing keys for bundles (ed25519; the site checks them with OpenSSL >= 1.1.1)."""


@command.command(name="generate")
@click.option("-o", "--out-dir", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Folder for stackpin.key (0600) and stackpin.pub.")
@click.option("--force", is_flag=True, help="Replace an existing key pair.")
@json_option
def generate(out_dir: Path, force: bool, as_json: bool) -> None:
    """Write a new key pair: keep stackpin.key private, send stackpin.pub to the sites."""
    pair = signing.generate(out_dir, force=force)
    if as_json:
        echo_json({"private_key": str(pair.private_path), "public_key": str(pair.public_path),
                   "fingerprint": pair.fingerprint})
        return
    click.echo(f"keys: {pair.private_path} (private, 0600) and {pair.public_path}")
    click.echo(f"keys: fingerprint {pair.fingerprint}")
