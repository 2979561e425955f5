"""Vendor rehearsal stand-ins: what marks them, what refuses to ship them, how one is made.

A site's real vendor files (the DTK torch, FlashAttention, triton) cannot reach this
machine, so a rehearsal builds DTK and ROCm cells from stand-ins that go through the same
build path: wheels with the vendor's exact file names, versions and labels whose content
is a CPU build or nothing. A stand-in is never the real thing: every wheel made here
carries a STACKPIN_REHEARSAL file in its dist-info saying what it stands in for, every
image built from them carries LABEL_REHEARSAL, and `bundle export` refuses such an image
unless the cell is named with --allow-rehearsal.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from stackpin.abi import parse_wheel_filename
from stackpin.errors import BundleError, ValidationError
from stackpin.target import LABEL_REHEARSAL

MARKER = "STACKPIN_REHEARSAL"  # in a stand-in wheel's dist-info: what it stands in for


def refuse_rehearsal(labels: Mapping[str, str], *, cell: str, tag: str,
                     allowed: Collection[str]) -> None:
    """BundleError when the image is a rehearsal and its cell was not allowed by name."""
    marked = labels.get(LABEL_REHEARSAL)
    if marked is None or cell in allowed:
        return
    msg = (
        f"{tag} is a vendor rehearsal image ({marked}), not a {cell} image for a site: "
        f"build it from the real vendor files, or pass --allow-rehearsal {cell} to bundle "
        f"the stand-in on purpose"
    )
    raise BundleError(msg)


@dataclass(frozen=True, kw_only=True)
class StandIn:
    """A wheel made from another: the vendor's exact file name, the other's content."""

    filename: str  # the vendor file name it must carry (the cell's pin)
    stands_for: str  # one line, written into the wheel and the image label


def relabel_wheel(source: Path, stand_in: StandIn, out_dir: Path) -> Path:
    """Copy ``source`` as the wheel ``stand_in.filename`` names: dist-info renamed, Version
    and Tag rewritten, the marker added, RECORD hashed again. The modules stay the source's."""
    target = parse_wheel_filename(stand_in.filename)
    old = parse_wheel_filename(source.name)
    if old.name != target.name:
        msg = f"{source.name} cannot stand in for {stand_in.filename}: another distribution"
        raise ValidationError(msg)
    old_info = f"{old.dist}-{old.version}.dist-info/"
    new_info = f"{target.dist}-{target.version}.dist-info/"
    tag = f"{target.python_tag}-{target.abi_tag}-{target.platform_tag}"
    out = out_dir / stand_in.filename
    records: list[str] = []
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename == old_info + "RECORD":
                continue
            name = new_info + item.filename[len(old_info):] if item.filename.startswith(
                old_info) else item.filename
            data = _rewrite(name, src.read(item), new_info=new_info, version=target.version,
                            tag=tag)
            records.append(_write(dst, name, data))
        records.append(_write(dst, new_info + MARKER, stand_in.stands_for.encode() + b"\n"))
        records.append(f"{new_info}RECORD,,")
        _write(dst, new_info + "RECORD", ("\n".join(records) + "\n").encode())
    return out


def _rewrite(name: str, data: bytes, *, new_info: str, version: str, tag: str) -> bytes:
    if name == new_info + "METADATA":
        return re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data, count=1)
    if name == new_info + "WHEEL":
        kept = [line for line in data.decode().splitlines() if not line.startswith("Tag:")]
        return ("\n".join([*kept, f"Tag: {tag}"]) + "\n").encode()
    return data


def _write(dst: zipfile.ZipFile, name: str, data: bytes) -> str:
    # A fixed time: the same source and pin give the same stand-in bytes (and sha256).
    member = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    member.compress_type = zipfile.ZIP_DEFLATED
    dst.writestr(member, data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"
