#!/usr/bin/env python3
"""Write the image info a lock replay runs with: what stackpin renders into the image's
/opt/stackpin/image.json for each variant, plus what the replay is and how it differs.

Run HERE from the repository root after scripts/gpu/stage-lock.py:

    python3 scripts/gpu/replay-image.py CELL OUT_DIR

OUT_DIR/image-stable.json and image-enhanced.json carry "run_kind": "lock replayed on
device" and "replay": each distribution the host provides itself (same version, its own
build) or runs as a CPython 3.12 build of the lock's version, named one by one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stackpin.context import read_sources
from stackpin.lock import read_lock
from stackpin.matrix import Variant
from stackpin.matrixfile import load_cells
from stackpin.render import RenderRequest, image_info

RUN_KIND = "lock replayed on device"


def main() -> int:
    cell_id, out = sys.argv[1], Path(sys.argv[2])
    root = Path.cwd()
    cells = load_cells(sorted((root / "pinning").glob("*.toml")))
    lock = read_lock(root, cell_id)
    if lock is None:
        print(f"no lock for {cell_id}: run stackpin lock {cell_id}", file=sys.stderr)
        return 3
    replay = json.loads((root / ".whl" / "lock" / "replay.json").read_text())
    differences = [
        {"name": e["name"], "version": e["version"], "how": e["how"],
         "lock_file": e["lock_file"], "replay_file": e["replay_file"] or "host's own build"}
        for e in replay["entries"] if e["how"] != "lock-file"]
    out.mkdir(parents=True, exist_ok=True)
    for variant in (Variant.STABLE, Variant.ENHANCED):
        info = image_info(RenderRequest(cell=cells[cell_id], variant=variant, lock=lock,
                                        sources=read_sources(root / "templates"),
                                        stackpin_version="replay"))
        info["run_kind"] = RUN_KIND
        info["replay"] = {"python": f"{replay['host_python']} (the lock: {lock.python})",
                          "differences": differences}
        path = out / f"image-{variant}.json"
        path.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        print(f"{path}: {len(info['pins'])} pins, {len(differences)} differences named")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
