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

from stackpin.abi import NAME_MAX

if TYPE_CHECKING:
    from stackpin.matrix import Cell, PinnedWheel

Found = tuple[str, str]  # (dotted path, message)

# Docker reference path component (distribution/reference): lower-case alphanumerics
# separated by one '.', or one or more '-'; '_' is left out to keep ids file-name plain.
CELL_ID_MAX = 64
CELL_ID = re.compile(r"^[a-z0-9]+(?:(?:\.|-+)[a-z0-9]+)*$")
WHEEL_FILENAME = re.compile(r"^[A-Za-z0-9_.+!-]+\.whl$")
# Values pip and packaging parse as numbers: bounded shapes, so a parse cannot blow up and
# a newline cannot add a line (an --index-url) to a requirements file.
GLIBC = re.compile(r"[0-9]{1,2}\.[0-9]{1,3}")
CPYTHON = re.compile(r"cp[0-9]{2,3}")
DIST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?")
VERSION = re.compile(r"[A-Za-z0-9.+!_-]{1,128}")
CONSTRAINT = re.compile(r"[A-Za-z0-9.,<>=!~* ]{1,128}")
REQUIREMENT_MAX = 500
MAX_EPOCH = (1 << 32) - 1  # SOURCE_DATE_EPOCH lands in tar headers and image configs
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
    "/var/lib/containers", "/run/podman", "/run/podman/podman.sock",  # Podman's store, socket
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/opt", "/srv", "/tmp", "/mnt", "/media",
)
# Mounting anything inside these is as good as mounting them.
SENSITIVE_HOST_TREES = ("/etc", "/root", "/boot", "/proc", "/sys", "/dev", "/run", "/var/run",
                        "/var/lib/docker", "/var/lib/containers", "/usr", "/bin", "/sbin",
                        "/lib", "/lib64", "/home")


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
        if (not WHEEL_FILENAME.fullmatch(name) or name.startswith(".")
                or len(name) > NAME_MAX):
            yield (f"{where}.{path}.filename",
                          f"a bare wheel file name of at most {NAME_MAX} characters (no "
                          "directory, absolute path, URL or odd character); put the file in "
                          "wheels/ and name it here")
    if cell.env_script and (not IMAGE_PATH.fullmatch(cell.env_script)
                            or ".." in cell.env_script.split("/")):
        yield (f"{where}.env_script",
                      "an absolute path inside the image without '..' or odd characters")
    yield from _run_problems(cell, f"{where}.run")
    yield from _number_problems(cell, where)
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


def _number_problems(cell: Cell, where: str) -> Iterator[Found]:
    """Values that become numbers or requirement lines: bounded, one line, plain."""
    if not GLIBC.fullmatch(cell.glibc):
        yield (f"{where}.glibc", "a glibc version like 2.35")
    if not CPYTHON.fullmatch(cell.python):
        yield (f"{where}.python", "a CPython tag like cp310")
    if not 0 <= cell.source_date_epoch <= MAX_EPOCH:
        yield (f"{where}.source_date_epoch", f"seconds since 1970, 0 to {MAX_EPOCH}")
    if not CONSTRAINT.fullmatch(cell.numpy):
        yield (f"{where}.numpy", "a version constraint like <2 (letters, digits, .,<>=!~*)")
    for key, versions in (("stack", cell.stack),
                          ("provided", {n: p.version for n, p in cell.provided.items()})):
        for name, version in versions.items():
            if not DIST_NAME.fullmatch(name):
                yield (f"{where}.{key}.{name}", "a distribution name (letters, digits, ._-)")
            elif not VERSION.fullmatch(version):
                yield (f"{where}.{key}.{name}", "an exact version of at most 128 characters "
                       "(letters, digits, .+!_-)")
    for name, entry in cell.provided.items():
        for index, text in enumerate(entry.requires):
            if len(text) > REQUIREMENT_MAX or not text.isprintable():
                yield (f"{where}.provided.{name}.requires[{index}]",
                       f"one printable requirement of at most {REQUIREMENT_MAX} characters")
    named = [(f"excluded.{name}", name) for name in cell.excluded]
    named += [(f"dropped[{index}].{key}", getattr(drop, key))
              for index, drop in enumerate(cell.dropped) for key in ("of", "requirement")]
    for path, name in named:
        if not DIST_NAME.fullmatch(name):
            yield (f"{where}.{path}", "a distribution name (letters, digits, ._-)")


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

