#!/usr/bin/env python3
"""Stage a cell's lock for a replay on the GPU host (no Docker, no network, CPython 3.12).

Run HERE, from the repository root, after `stackpin wheels fetch CELL`:

    python3 scripts/gpu/stage-lock.py CELL HOST_PIP_LIST.json [--parts-mib 55]

For every distribution the lock installs it decides what the host will run, and writes that
as data (.whl/lock/replay.json), so the report can name each difference:
  - "host": the host already has this exact version (its own build for its CPython):
    torch 2.11.0+cu130 and its CUDA libraries among them; nothing is carried;
  - "lock-file": the lock's own file (pure Python or abi3 wheels run on 3.12 as they are),
    same sha256 as the image installs;
  - "cp312-build": the same version's build for CPython 3.12, downloaded here (the lock's
    file is a cp311 build); its sha256 is recorded beside the lock's.
The carried files go into one tar, cut into parts that each fit a device call beside the
working tree (.whl/lock/part-*), with their sha256 in .whl/lock/parts.sha256;
scripts/gpu/stage-part.sh keeps one a call on the device, scripts/gpu/replay-setup.sh joins,
checks and installs them there (scripts/gpu/PLAN-issue20.md). A device call carries at most
64 MiB with the working tree (about 9 MB): 55 MiB parts leave room for the tree to grow.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

OUT = Path(".whl/lock")
PLATFORMS = ["manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_26_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def runs_on_cp312(filename: str) -> bool:
    """Whether a wheel's own tags admit CPython 3.12 (py3-none, abi3 from <= 3.12)."""
    _name, _version, _build, tags = parse_wheel_filename(filename)
    for tag in tags:
        if tag.abi == "none" and tag.interpreter in ("py3", "py312", "cp312"):
            return True
        if (tag.abi == "abi3" and tag.interpreter.startswith("cp")
                and int(tag.interpreter[3:] or 0) <= 12):
            return True
        if tag.abi == "cp312":
            return True
    return False


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_cp312(name: str, version: str, dest: Path) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
            "--abi", "abi3", "--abi", "none", "-d", str(dest), f"{name}=={version}"]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    before = set(dest.iterdir())
    subprocess.run(argv, check=True)
    (new,) = set(dest.iterdir()) - before
    return new


def part_size(total: int, max_mib: int) -> int:
    """Bytes per part: the fewest parts of at most ``max_mib`` MiB, cut evenly (each device
    call then carries the same, with the most room left for the working tree)."""
    limit = max_mib * 2**20
    count = -(-total // limit)
    return -(-total // count)


# The device tool carries the working tree and the part together, at most 64 MiB; a MiB of
# margin for parts.sha256 and files written before the call.
DEVICE_CARRY_MIB = 64


def room_beside_tree_mib() -> int:
    """What a part may hold beside the working tree as the device tool copies it (tracked
    and untracked, not ignored): the tree grew from 8 to 16 MB with evidence, and 55 MiB
    parts no longer fit."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    tree = sum(Path(name).stat().st_size for name in listed if name and Path(name).is_file())
    return DEVICE_CARRY_MIB - 1 - -(-tree // 2**20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cell")
    parser.add_argument("host_pip_list", type=Path)
    parser.add_argument("--parts-mib", type=int, default=None,
                        help="the most a part may hold, MiB (the fewest parts, cut evenly); "
                             "default: what the device tool's 64 MiB leaves beside the tree")
    args = parser.parse_args()
    if args.parts_mib is None:
        args.parts_mib = room_beside_tree_mib()
    lock = json.loads(Path(f"pinning/locks/{args.cell}.lock").read_text())
    wheelhouse = Path("wheels") / args.cell
    host = {str(canonicalize_name(p["name"])): p["version"]
            for p in json.loads(args.host_pip_list.read_text())}
    shutil.rmtree(OUT, ignore_errors=True)
    carried = OUT / "wheels"
    carried.mkdir(parents=True)
    entries = []
    for wheel in lock["wheels"]:
        if wheel["group"] == "base":
            continue
        entry = {"name": wheel["name"], "version": wheel["version"], "group": wheel["group"],
                 "lock_file": wheel["filename"], "lock_sha256": wheel["sha256"]}
        if host.get(wheel["name"]) == wheel["version"]:
            entry |= {"how": "host", "replay_file": "", "replay_sha256": ""}
        elif runs_on_cp312(wheel["filename"]):
            shutil.copy2(wheelhouse / wheel["filename"], carried / wheel["filename"])
            entry |= {"how": "lock-file", "replay_file": wheel["filename"],
                      "replay_sha256": wheel["sha256"]}
        else:
            got = download_cp312(wheel["name"], wheel["version"], carried)
            entry |= {"how": "cp312-build", "replay_file": got.name,
                      "replay_sha256": sha256(got)}
        entries.append(entry)
    replay = {"cell": lock["cell"], "lock_digest": hashlib.sha256(
        Path(f"pinning/locks/{args.cell}.lock").read_bytes()).hexdigest(),
        "host_python": "cp312", "lock_python": lock["python"], "entries": entries}
    (carried / "replay.json").write_text(json.dumps(replay, indent=2, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "lock.tar"
        with tarfile.open(bundle, "w") as tar:
            tar.add(carried, arcname="wheels")
        size = part_size(bundle.stat().st_size, args.parts_mib)
        subprocess.run(["split", "-b", str(size), "-d", str(bundle), str(OUT / "part-")],
                       check=True)
    shutil.copy2(carried / "replay.json", OUT / "replay.json")
    (OUT / "parts.sha256").write_text("".join(
        f"{sha256(part)}  {part.name}\n" for part in sorted(OUT.glob("part-*"))))
    shutil.rmtree(carried)
    counts = {h: sum(e["how"] == h for e in entries) for h in ("host", "lock-file", "cp312-build")}
    parts = sorted(p.name for p in OUT.glob("part-*"))
    print(f"staged {args.cell}: {counts}; parts {parts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
