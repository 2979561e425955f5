"""Stand-in wheels for a vendor rehearsal: the vendor's exact file name, another content.

Three kinds, each carrying a STACKPIN_REHEARSAL file in its dist-info that says what it
stands in for and what it holds:

- ``relabel_wheel``: a real wheel from the index (the CPU torch, triton) under the vendor's
  name, version, tag and requirements. Its modules are copied as they are compressed in the
  source (never recompressed), and every file written anew is stored uncompressed, so the
  same pinned source gives the same stand-in bytes on every host, in seconds;
- ``made_wheel`` with no modules: metadata only (vLLM, pytorch-triton-rocm);
- ``made_wheel`` with ``no_kernel_module``: a package that imports and whose every
  attribute refuses, naming the stand-in (FlashAttention: L0 imports it, L3 fails on it).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from stackpin.abi import WheelInfo, parse_wheel_filename
from stackpin.errors import ValidationError
from stackpin.lock import atomic_write

MARKER = "STACKPIN_REHEARSAL"  # in a stand-in wheel's dist-info: what it stands in for
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the earliest a zip can say: no clock
_FILE_MODE = 0o100644 << 16
_MADE_BY_UNIX = (3 << 8) | 20  # so the external attributes are read as Unix modes
_ZIP32_MAX = 0xFFFFFFFF


@dataclass(frozen=True, kw_only=True)
class StandIn:
    """A wheel made from another: the vendor's exact file name, the other's content."""

    filename: str  # the vendor file name it must carry (the cell's pin)
    stands_for: str  # one line, written into the wheel and, through the cell, the image
    # The Requires-Dist lines to write (the cell's placeholder, which the lock was resolved
    # with); None keeps the source's.
    requires: tuple[str, ...] | None = None
    # A module of the source whose ``__version__`` must say the vendor's version (torch's
    # version.py: the imported torch reports its label, and L0.torch_version reads it).
    version_module: str = ""
    extra_files: Mapping[str, str] = field(default_factory=dict)


def relabel_wheel(source: Path, stand_in: StandIn, out_dir: Path) -> Path:
    """Copy ``source`` as the wheel ``stand_in.filename`` names: dist-info renamed, Version,
    Requires-Dist and Tag rewritten, the marker added, RECORD written again."""
    target = parse_wheel_filename(stand_in.filename)
    old = parse_wheel_filename(source.name)
    if old.name != target.name:
        msg = f"{source.name} cannot stand in for {stand_in.filename}: another distribution"
        raise ValidationError(msg)
    renames = {f"{old.dist}-{old.version}.dist-info/": f"{target.dist}-{target.version}.dist-info/",
               f"{old.dist}-{old.version}.data/": f"{target.dist}-{target.version}.data/"}
    new_info = renames[f"{old.dist}-{old.version}.dist-info/"]
    out = out_dir / stand_in.filename
    with zipfile.ZipFile(source) as src, source.open("rb") as raw_src, \
            atomic_write(out) as tmp, tmp.open("wb") as dst_file:
        known = _record_lines(src, f"{old.dist}-{old.version}.dist-info/RECORD")
        writer = _ZipWriter(dst_file)
        records = []
        for item in src.infolist():
            if item.filename.endswith("/RECORD") and item.filename.startswith(tuple(renames)):
                continue
            name = _renamed(item.filename, renames)
            if name.startswith(new_info) or name == stand_in.version_module:
                data = _rewrite(name, src.read(item), stand_in, new_info=new_info,
                                version=target.version, tag=_tag(target))
                records.append(writer.add(name, data, mode=item.external_attr))
            elif item.filename in known:
                writer.add_raw(name, _raw_member(raw_src, item), item)
                records.append([name, *known[item.filename]])
            else:  # not in the source's RECORD: hash what it holds
                writer.add_raw(name, _raw_member(raw_src, item), item)
                records.append(_record(name, src.read(item)))
        records += [writer.add(new_info + path, text.encode())
                    for path, text in sorted(_dist_info_extras(stand_in).items())]
        writer.add(new_info + "RECORD", _record_text([*records, [f"{new_info}RECORD", "", ""]]))
        writer.close()
    return out


def made_wheel(stand_in: StandIn, out_dir: Path, *, modules: Mapping[str, str] | None = None,
               summary: str = "") -> Path:
    """A wheel made here: the vendor's name and metadata, ``modules`` (path -> text) or none."""
    target = parse_wheel_filename(stand_in.filename)
    info = f"{target.dist}-{target.version}.dist-info/"
    metadata = ["Metadata-Version: 2.1", f"Name: {target.name}", f"Version: {target.version}",
                f"Summary: {summary or stand_in.stands_for}"]
    metadata += [f"Requires-Dist: {req}" for req in stand_in.requires or ()]
    files = {**(modules or {}),
             info + "METADATA": "\n".join(metadata) + "\n",
             info + "WHEEL": ("Wheel-Version: 1.0\nGenerator: stackpin rehearsal\n"
                              f"Root-Is-Purelib: false\nTag: {_tag(target)}\n"),
             **{info + path: text for path, text in _dist_info_extras(stand_in).items()}}
    out = out_dir / stand_in.filename
    with atomic_write(out) as tmp, tmp.open("wb") as dst_file:
        writer = _ZipWriter(dst_file)
        records = [writer.add(name, text.encode()) for name, text in sorted(files.items())]
        writer.add(info + "RECORD", _record_text([*records, [f"{info}RECORD", "", ""]]))
        writer.close()
    return out


def no_kernel_module(module: str, *, version: str, stands_for: str) -> dict[str, str]:
    """A package ``module`` that imports and refuses every attribute by name."""
    text = f'''"""{stands_for}"""

__version__ = {version!r}
STACKPIN_REHEARSAL = {stands_for!r}


def __getattr__(name: str) -> object:
    # Imports (L0.imports) succeed; any kernel a caller asks for fails here, by name.
    raise AttributeError(f"{module}.{{name}}: " + STACKPIN_REHEARSAL + ": it has no kernels")
'''
    return {f"{module}/__init__.py": text}


# --- dist-info rewriting -------------------------------------------------------------------


def _tag(target: WheelInfo) -> str:
    return f"{target.python_tag}-{target.abi_tag}-{target.platform_tag}"


def _dist_info_extras(stand_in: StandIn) -> dict[str, str]:
    return {MARKER: stand_in.stands_for + "\n", **stand_in.extra_files}


def _renamed(name: str, renames: Mapping[str, str]) -> str:
    for old, new in renames.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _rewrite(name: str, data: bytes, stand_in: StandIn, *, new_info: str, version: str,
             tag: str) -> bytes:
    if name == new_info + "METADATA":
        text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", data.decode(), count=1)
        if stand_in.requires is not None:
            kept = [ln for ln in text.split("\n") if not ln.startswith("Requires-Dist:")]
            head, sep, body = "\n".join(kept).partition("\n\n")
            text = head + "".join(f"\nRequires-Dist: {r}" for r in stand_in.requires) + sep + body
        return text.encode()
    if name == new_info + "WHEEL":
        kept = [line for line in data.decode().splitlines() if not line.startswith("Tag:")]
        return ("\n".join([*kept, f"Tag: {tag}"]) + "\n").encode()
    if name == stand_in.version_module:
        text, count = re.subn(r"(?m)^__version__\s*=.*$", f"__version__ = {version!r}",
                              data.decode(), count=1)
        if count != 1:
            msg = f"{name} has no __version__ line to give the vendor's version {version}"
            raise ValidationError(msg)
        return (text + f"\nSTACKPIN_REHEARSAL = {stand_in.stands_for!r}\n").encode()
    return data


def _record_lines(src: zipfile.ZipFile, record: str) -> dict[str, list[str]]:
    """The source RECORD's hash and size per path (the copied bytes are the same)."""
    try:
        text = src.read(record).decode()
    except KeyError:
        return {}
    return {row[0]: row[1:3] for row in csv.reader(io.StringIO(text)) if len(row) >= 3 and row[1]}


def _record(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def _record_text(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


# --- a zip writer that copies compressed members as they are -----------------------------


def _raw_member(fp: BinaryIO, item: zipfile.ZipInfo) -> bytes:
    """The compressed bytes of one member, read past its local header."""
    fp.seek(item.header_offset)
    header = fp.read(30)
    if header[:4] != b"PK\x03\x04":
        msg = f"{item.filename}: no local file header where the zip's directory says"
        raise ValidationError(msg)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    fp.seek(item.header_offset + 30 + name_len + extra_len)
    return fp.read(item.compress_size)


class _ZipWriter:
    """Local headers, data, then the central directory: no clock, no zip64, nothing else."""

    def __init__(self, fp: BinaryIO) -> None:
        self.fp = fp
        self.central: list[bytes] = []

    def add(self, name: str, data: bytes, *, mode: int = 0) -> list[str]:
        """A new member, stored: its bytes do not depend on the host's zlib."""
        self._member(name, data, method=zipfile.ZIP_STORED, crc=zlib.crc32(data),
                     size=len(data), external=mode or _FILE_MODE)
        return _record(name, data)

    def add_raw(self, name: str, raw: bytes, item: zipfile.ZipInfo) -> None:
        self._member(name, raw, method=item.compress_type, crc=item.CRC, size=item.file_size,
                     external=item.external_attr)

    def _member(self, name: str, payload: bytes, *, method: int, crc: int, size: int,
                external: int) -> None:
        encoded = name.encode()
        offset = self.fp.tell()
        if max(offset, len(payload), size) >= _ZIP32_MAX or len(self.central) >= 0xFFFF:
            msg = f"{name}: a stand-in this large needs zip64, which stackpin does not write"
            raise ValidationError(msg)
        flags = 0 if encoded.isascii() else 0x800
        common = struct.pack("<HHHHHIII", 20, flags, method, 0, _DOS_DATE, crc, len(payload),
                             size)
        self.fp.write(b"PK\x03\x04" + common + struct.pack("<HH", len(encoded), 0) + encoded)
        self.fp.write(payload)
        self.central.append(b"PK\x01\x02" + struct.pack("<H", _MADE_BY_UNIX) + common
                            + struct.pack("<HHHHHI", len(encoded), 0, 0, 0, 0, external)
                            + struct.pack("<I", offset) + encoded)

    def close(self) -> None:
        start = self.fp.tell()
        for entry in self.central:
            self.fp.write(entry)
        size = self.fp.tell() - start
        count = len(self.central)
        self.fp.write(b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, count, count, size, start, 0))
