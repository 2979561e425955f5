"""Clamp what this build step wrote to SOURCE_DATE_EPOCH, so the engine's own layer is
reproducible (docs/reproducibility.md, "Timestamps clamped by the steps").

Run at the end of a RUN step as ``python3 clamp.py EPOCH START_NS`` (START_NS: the step's
start, ``date +%s%N``; a third argument walks another folder than /, for tests). Every
entry of the root filesystem whose status changed since the step began (its ctime: it was
written, created, or had an entry added or removed) and whose mtime is later than EPOCH
gets mtime EPOCH; older mtimes are kept (normalisation's rule).
Entries the step did not touch are left alone, however new, so a vendor base's files are
never copied up into this layer. Mount points (/proc, /sys, /dev, the build's bind mounts
and the files the engine mounts into /etc) and what lies under them are skipped.

Standard library and GNU find/touch only: it runs with the base image's python3, before
the venv exists.
"""

from __future__ import annotations

import subprocess
import sys


def mount_points(mountinfo: str) -> set[str]:
    """Every mount point but / (field 5 of /proc/self/mountinfo, octal escapes decoded)."""
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.add(_unescape(fields[4]))
    points.discard("/")
    return points


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \040, \011, \012, \134.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


# The kernel stamps ctime from a coarse clock, up to a tick behind the fine one `date`
# reads, and find compares whole seconds: an entry written right after the step began may
# carry a ctime a little before START_NS. A second of margin covers that; the previous
# step's own entries, changed in that second by its clamp, have mtimes of at most EPOCH
# already and are left alone.
MARGIN_NS = 10**9


def find_argv(root: str, epoch: int, since_ns: int, skip: set[str]) -> list[str]:
    """GNU find over ``root`` that sets mtime ``epoch`` on every entry whose status changed
    since ``since_ns`` (less the margin) and whose mtime is later than ``epoch``; mount
    points in ``skip`` are pruned. find walks in C: a Python walk of a 70,000-entry tree
    took 19 s of a loaded 2-core build step."""
    since = (since_ns - MARGIN_NS) // 10**9
    prune: list[str] = []
    for point in sorted(p for p in skip if p == root or p.startswith(root.rstrip("/") + "/")):
        prune += [*(["-o"] if prune else []), "-path", point]
    head = ["find", root, "-xdev"]
    if prune:
        head += ["(", *prune, ")", "-prune", "-o"]
    return [*head, "-newerct", f"@{since}", "-newermt", f"@{epoch}",
            "-exec", "touch", "-h", "-c", "-d", f"@{epoch}", "{}", "+"]


def main() -> int:
    epoch, since_ns = int(sys.argv[1]), int(sys.argv[2])
    root = sys.argv[3] if len(sys.argv) > 3 else "/"
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        skip = mount_points(handle.read())
    argv = find_argv(root, epoch, since_ns, skip)
    done = subprocess.run(argv, check=False)
    print(f"stackpin clamp: what this step wrote under {root} is at most {epoch}"
          if done.returncode == 0 else f"stackpin clamp: find exited {done.returncode}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
