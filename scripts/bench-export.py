"""The export's images stream against a plain `docker save`, side by side in one run.

Usage: .venv/bin/python scripts/bench-export.py IMAGE SCRATCH SRC [SRC...]   (DOCKER_HOST as usual)

SRC is the ``src`` folder of a stackpin checkout (e.g. ``src`` and the ``src`` of a
``git worktree add ../before <commit>``), so two versions of the stream run against the
same image in the same run. Each round times `docker save IMAGE -o SCRATCH/plain.tar`
and, for each SRC, a fresh Python process running ``stackpin.bundle.stream.write_images``
(threads=-1: one zstd worker per CPU, as `stackpin bundle export`) into SCRATCH; the
second round runs them in the opposite order. Then `zstd -3 -T0` of the plain save gives
the size reference. Prints a Markdown table; everything it writes in SCRATCH is removed.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

STREAM = """
import sys, time
from pathlib import Path
from stackpin.bundle.stream import write_images
from stackpin.engine.docker_api import DockerEngine
with DockerEngine.connect() as engine:
    started = time.monotonic()
    stats, _ = write_images(engine, [sys.argv[1]], Path(sys.argv[2]), threads=-1)
    print(time.monotonic() - started, stats.bytes, stats.tar_bytes)
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def plain_save(image: str, scratch: Path) -> tuple[float, int, float]:
    out, cpu = scratch / "plain.tar", _children_cpu()
    started = time.monotonic()
    subprocess.run(["docker", "save", image, "-o", str(out)], check=True)
    seconds, size = time.monotonic() - started, out.stat().st_size
    out.unlink()
    return seconds, size, _children_cpu() - cpu


def stream(image: str, scratch: Path, src: Path) -> tuple[float, int, float]:
    out, cpu = scratch / "images.tar.zst", _children_cpu()
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    done = subprocess.run([sys.executable, "-c", STREAM, image, str(out)], env=env,
                          check=True, capture_output=True, text=True)
    out.unlink()
    seconds, size, _tar_bytes = done.stdout.split()
    return float(seconds), int(size), _children_cpu() - cpu


def zstd_size(image: str, scratch: Path) -> int:
    out = scratch / "plain.tar"
    subprocess.run(["docker", "save", image, "-o", str(out)], check=True)
    compressed = subprocess.run(["zstd", "-q", "-3", "-T0", "-c", str(out)], check=True,
                                stdout=subprocess.PIPE).stdout
    out.unlink()
    return len(compressed)


def main() -> None:
    image, scratch, sources = sys.argv[1], Path(sys.argv[2]), [Path(s) for s in sys.argv[3:]]
    scratch.mkdir(parents=True, exist_ok=True)
    plain_save(image, scratch)  # warm-up: the daemon's layers into the page cache
    runs: list[tuple[str, tuple[float, int, float]]] = []
    order: list[str | Path] = ["docker save", *sources]
    for rnd in (order, order[::-1]):
        for what in rnd:
            if isinstance(what, Path):
                runs.append((f"stream from {what}", stream(image, scratch, what)))
            else:
                runs.append((what, plain_save(image, scratch)))
            print(runs[-1], file=sys.stderr, flush=True)
    reference = zstd_size(image, scratch)
    saves = [r[0] for name, r in runs if name == "docker save"]
    mean = sum(saves) / len(saves)
    print(f"`zstd -3 -T0` of the save: {reference} bytes; docker save mean {mean:.1f} s")
    print("| run | seconds | CPU s (client) | bytes | vs mean docker save | vs zstd -3 size |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (seconds, size, cpu) in runs:
        ratio = f"{size / reference:.3f}" if name != "docker save" else "-"
        print(f"| {name} | {seconds:.1f} | {cpu:.1f} | {size:,} | {seconds / mean:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
