"""Matrix values that flow into Docker references, file names, mounts and shell: safe shapes.

Pure rules over decoded cells; each yields ``(dotted path, message)`` pairs that the
matrix module reports as configuration problems. They
refuse instead of repairing: a wheel filename with a directory is refused, never cut to
its last component; a mount of the host's ``/etc`` is refused, never made read-only.

``SENSITIVE_HOST_PATHS`` is the list the site scripts apply to signed run flags too
(``bundle/bin/lib.sh``; a unit test keeps the two equal).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stackpin.matrix import Cell, PinnedWheel

Found = tuple[str, str]  # (dotted path, message)

# Docker reference path component (distribution/reference): lower-case alphanumerics
# separated by one '.', or one or more '-'; '_' is left out to keep ids file-name plain.
CELL_ID_MAX = 64
CELL_ID = re.compile(r"^[a-z0-9]+(?:(?:\.|-+)[a-z0-9]+)*$")
WHEEL_FILENAME = re.compile(r"^[A-Za-z0-9_.+!-]+\.whl$")
IMAGE_PATH = re.compile(r"^/[A-Za-z0-9._+/-]+$")
DEVICE = re.compile(r"^/dev/[A-Za-z0-9._/-]+(?::/dev/[A-Za-z0-9._/-]+)?(?::[rwm]+)?$")
MIRROR = re.compile(r"^(?:https?://[A-Za-z0-9.-]+(?::\d+)?(?:/[A-Za-z0-9._~%+/-]*)?"
                    r"|file:///[A-Za-z0-9._+/-]+)$")
SHM_SIZE = re.compile(r"[0-9]+[bkmgBKMG]?")
GPUS = re.compile(r'[A-Za-z0-9,=:"-]+')
IPC = re.compile(r"host|private|shareable|none")
VISIBLE = re.compile(r"[A-Za-z0-9-]+(?:,[A-Za-z0-9-]+)*")
# docker --ulimit NAME=SOFT[:HARD]; only the limits a training container needs raised
# (bin/lib.sh accepts the same shape in a signed profile).
ULIMIT = re.compile(r"(?:memlock|stack|nofile)=-?[0-9]+(?::-?[0-9]+)?")
OPTION_VALUE = re.compile(r"[A-Za-z0-9_.:=/-]+")
SENSITIVE_HOST_PATHS = (
    "/", "/etc", "/root", "/home", "/boot", "/proc", "/sys", "/dev", "/run", "/var",
    "/var/run", "/var/lib", "/var/lib/docker", "/var/run/docker.sock", "/run/docker.sock",
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/opt", "/srv", "/tmp", "/mnt", "/media",
)
# Mounting anything inside these is as good as mounting them.
SENSITIVE_HOST_TREES = ("/etc", "/root", "/boot", "/proc", "/sys", "/dev", "/run", "/var/run",
                        "/var/lib/docker", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/home")


def sensitive_host_path(path: str) -> bool:
    """True for a relative path, a '..' trick, or a system or credential location."""
    if not path.startswith("/") or ".." in path.split("/") or "." in path.split("/")[1:]:
        return True
    normal = "/" + "/".join(part for part in path.split("/") if part)
    return normal in SENSITIVE_HOST_PATHS or any(
        normal.startswith(tree + "/") for tree in SENSITIVE_HOST_TREES)


def cell_problems(cell: Cell, wheels: list[tuple[str, PinnedWheel]]) -> Iterator[Found]:
    """Every unsafe value of one cell (``wheels``: its pinned wheels with their paths)."""
    where = f"cells.{cell.id}"
    if len(cell.id) > CELL_ID_MAX or not CELL_ID.fullmatch(cell.id):
        yield (where, f"a cell id is 1-{CELL_ID_MAX} lower-case letters and digits "
                      "joined by single '.' or '-' (it becomes an image name and file names)")
    for path, wheel in wheels:
        name = wheel.filename
        if not WHEEL_FILENAME.fullmatch(name) or name.startswith("."):
            yield (f"{where}.{path}.filename",
                          "a bare wheel file name (no directory, absolute path, URL or odd "
                          "character); put the file in wheels/ and name it here")
    if cell.env_script and (not IMAGE_PATH.fullmatch(cell.env_script)
                            or ".." in cell.env_script.split("/")):
        yield (f"{where}.env_script",
                      "an absolute path inside the image without '..' or odd characters")
    yield from _run_problems(cell, f"{where}.run")
    bootstrap = cell.base.bootstrap
    if bootstrap is not None and (not MIRROR.fullmatch(bootstrap.mirror)
                                  or ".." in bootstrap.mirror.split("/")
                                  or (bootstrap.mirror.startswith("file://")
                                      and sensitive_host_path(bootstrap.mirror[7:]))):
        yield (f"{where}.base.bootstrap.mirror",
                      "an http(s):// mirror URL, or file:/// of a mirror folder that is not "
                      "a system location, without '..'")


def _run_problems(cell: Cell, where: str) -> Iterator[Found]:
    for index, volume in enumerate(cell.run.volumes):
        parts = volume.split(":")
        host, inside = parts[0], parts[1] if len(parts) > 1 else ""
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            yield (f"{where}.volumes[{index}]", "host:container[:ro|rw]")
        elif sensitive_host_path(host):
            yield (f"{where}.volumes[{index}]",
                          f"'{host}' is the host root, a system or credential location, or not "
                          "a plain absolute path; mount the one folder the image needs")
        elif not IMAGE_PATH.fullmatch(inside) or ".." in inside.split("/") or inside == "/":
            yield (f"{where}.volumes[{index}]",
                          "the container side is an absolute path other than '/' without '..'")
    for index, device in enumerate(cell.run.devices):
        if not DEVICE.fullmatch(device) or ".." in device.split("/"):
            yield (f"{where}.devices[{index}]", "a /dev/... node without '..'")
    run = cell.run
    for key, value, shape, expected in (
        ("shm_size", run.shm_size, SHM_SIZE, "a size such as 16g"),
        ("gpus", run.gpus, GPUS, "a GPU request such as all or device=0,1"),
        ("ipc", run.ipc, IPC, "host, private, shareable or none"),
        ("visible_devices", run.visible_devices, VISIBLE, "card indices such as 0,1"),
    ):
        if value and not shape.fullmatch(value):
            yield (f"{where}.{key}", f"expected {expected}")
    for index, limit in enumerate(run.ulimits):
        if not ULIMIT.fullmatch(limit):
            yield (f"{where}.ulimits[{index}]",
                   "memlock, stack or nofile=SOFT[:HARD], -1 for unlimited")
    for key, values in (("group_add", run.group_add), ("cap_add", run.cap_add),
                        ("security_opt", run.security_opt)):
        for index, value in enumerate(values):
            if not OPTION_VALUE.fullmatch(value):
                yield (f"{where}.{key}[{index}]", "a plain value (letters, digits, ._:=/-)")


def duplicate_ids(files: list[tuple[str, list[str]]]) -> list[tuple[str, Found]]:
    """A cell id declared by two files: (the later file, problem) per repeat."""
    first: dict[str, str] = {}
    problems = []
    for source, ids in files:
        for cell_id in ids:
            if cell_id in first:
                problems.append((source, (
                    f"cells.{cell_id}", f"the id is also declared in {first[cell_id]}; "
                    "cell ids are unique across every matrix file: rename one")))
            else:
                first[cell_id] = source
    return problems

