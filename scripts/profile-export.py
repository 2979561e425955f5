"""Where the bundle export's time goes (issue 15): the images stream against a plain save.

Usage: .venv/bin/python scripts/profile-export.py IMAGE [OUT_DIR]   (DOCKER_HOST as usual)

1. reads `docker save IMAGE` from the daemon and throws it away (what `docker save` costs);
2. runs the export's images stream (stackpin.bundle.stream.write_images: save -> each
   layer into a zstd -3 frame of its own as it arrives -> the frames in the OCI layout's
   digest order) under cProfile, and prints both times and the functions that took the
   most time of their own. For before/after timings without the profiler, see
   scripts/bench-export.py.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

from stackpin.bundle.stream import write_images
from stackpin.engine import SaveRequest
from stackpin.engine.docker_api import DockerEngine


def main() -> None:
    image = sys.argv[1]
    out_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.gettempdir())
    with DockerEngine.connect() as engine:
        started, size = time.monotonic(), 0
        for chunk in engine.save(SaveRequest(images=(image,))):
            size += len(chunk)
        print(f"plain save: {size} bytes in {time.monotonic() - started:.1f} s")
        out = out_dir / "profile-export.tar.zst"
        profile = cProfile.Profile()
        started = time.monotonic()
        profile.enable()
        stats, _ = write_images(engine, [image], out, threads=2)
        profile.disable()
        print(f"images stream: {stats.tar_bytes} -> {stats.bytes} bytes in "
              f"{time.monotonic() - started:.1f} s")
        out.unlink()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
