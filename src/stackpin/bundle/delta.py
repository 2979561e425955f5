"""Delta bundles: ship only the layers a site lacks (pure).

A site describes what it holds with ``bin/inventory.sh``: one line per layer its engine
(or registry) has, by chain ID and diff ID, ending in the sha256 of every line before it.
``bundle export --against INVENTORY`` then leaves out of ``images.tar.zst`` every layer
blob whose chain ID the site holds in every place the bundle's images use it; the
manifest still names each image whole (config and manifest digests, every layer), and
records which layers it expects the site to have, so ``bin/load.sh`` and ``bin/push.sh``
can refuse, naming them, when they are absent.

Why the chain ID and not the diff ID: a store keys a layer by the chain of everything
below it (the OCI image spec's ChainID), and ``docker load`` on the classic store skips
reading a layer's file exactly when that chain already exists. The same content on
another parent is another layer there, so it must travel.

The inventory is checksummed, not signed: it only decides what to leave out. A damaged or
forged one can make the bundle lack a layer the site does not have, which the site
scripts then refuse (nothing is loaded); it can never change what an image is.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stackpin.errors import BundleError
from stackpin.untrusted import shown

INVENTORY_FORMAT = "stackpin-inventory 1"
MAX_INVENTORY_BYTES = 16 << 20
_DIGEST = r"sha256:[0-9a-f]{64}"
_LAYER = re.compile(rf"^layer ({_DIGEST}) ({_DIGEST})$")
_SUM = re.compile(r"^sha256 ([0-9a-f]{64})$")
_NOTE = re.compile(r"^(#|engine |registry |created )")


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """What a site holds: chain ID -> diff ID of every layer, and the file's checksum."""

    layers: Mapping[str, str]
    sha256: str

    @property
    def chains(self) -> frozenset[str]:
        return frozenset(self.layers)


@dataclass(frozen=True, kw_only=True)
class BaseLayer:
    """A layer an image of a delta bundle expects the site to hold."""

    chain_id: str
    diff_id: str


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The ChainID of each layer (OCI image spec): the first is its diff ID, each next one
    sha256 of "PARENT_CHAIN DIFF_ID"."""
    chains: list[str] = []
    for diff_id in diff_ids:
        if not chains:
            chains.append(diff_id)
            continue
        joined = f"{chains[-1]} {diff_id}".encode()
        chains.append(f"sha256:{hashlib.sha256(joined).hexdigest()}")
    return chains


def parse_inventory(data: bytes, *, what: str) -> Inventory:
    """The inventory in ``data`` (``bin/inventory.sh``'s output), checked line by line and
    against its closing checksum; anything else is one BundleError naming the line."""
    if len(data) > MAX_INVENTORY_BYTES:
        msg = f"{what} is larger than {MAX_INVENTORY_BYTES} bytes: not an inventory"
        raise BundleError(msg)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        msg = f"{what} is not ASCII text: not a stackpin inventory; run bin/inventory.sh again"
        raise BundleError(msg) from None
    lines = text.split("\n")
    if len(lines) < 3 or lines[-1] != "" or lines[0] != INVENTORY_FORMAT:
        msg = (f"{what} does not start with '{INVENTORY_FORMAT}' and end with a newline: "
               "write it with the bundle's bin/inventory.sh")
        raise BundleError(msg)
    closing = _SUM.match(lines[-2])
    body = "".join(line + "\n" for line in lines[:-2])
    if closing is None or hashlib.sha256(body.encode()).hexdigest() != closing.group(1):
        msg = (f"{what}: its closing sha256 line does not match the lines above it (cut "
               "short or edited): write it again with bin/inventory.sh")
        raise BundleError(msg)
    layers: dict[str, str] = {}
    for number, line in enumerate(lines[1:-2], start=2):
        found = _LAYER.match(line)
        if found:
            layers[found.group(1)] = found.group(2)
        elif not _NOTE.match(line):
            msg = f"{what}, line {number}: {shown(line, limit=80)!r} is not an inventory line"
            raise BundleError(msg)
    return Inventory(layers=layers, sha256=hashlib.sha256(data).hexdigest())


def held_layers(diff_ids: Sequence[str], held: Iterable[str]) -> list[BaseLayer]:
    """The layers of an image (by diff IDs, bottom first) whose chain the site holds."""
    have = frozenset(held)
    return [BaseLayer(chain_id=chain, diff_id=diff)
            for chain, diff in zip(chain_ids(diff_ids), diff_ids, strict=True) if chain in have]


def omitted_blobs(images: Sequence[Sequence[str]], held: Iterable[str]) -> frozenset[str]:
    """The layer blobs (diff IDs) a delta leaves out: those held in every place any of
    ``images`` (each its diff IDs, bottom first) uses them."""
    have = frozenset(held)
    needed: set[str] = set()
    present: set[str] = set()
    for diff_ids in images:
        for chain, diff in zip(chain_ids(diff_ids), diff_ids, strict=True):
            (present if chain in have else needed).add(diff)
    return frozenset(present - needed)
