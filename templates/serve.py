"""Start Unsloth Studio's backend from the installed unsloth wheel, offline.

Studio ships inside the unsloth wheel as ``studio/backend/run.py``; this launcher finds that
file in the image's environment and replaces itself with it, passing every argument on.
Standard library only, and nothing is imported from Studio here, so a broken install fails
with one line naming the cause instead of a traceback deep in the app.

The offline switches (HF_HUB_OFFLINE, UNSLOTH_DISABLE_DIFFUSERS_AUTOREPAIR, ...) are the
image's environment, declared with the service in the matrix (stackpin.matrix.Service).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

# Set by `stackpin serve --no-devices`, `bin/start.sh --no-devices` and `stackpin verify
# --no-devices` (stackpin.runprofile.NO_DEVICES_ENV; a parity test holds the names equal):
# an accelerator image run on a host with no card. Studio's run.py setdefaults
# UNSLOTH_DISABLE_CPU_FALLBACK=1, so every model load would fail "cannot find any torch
# accelerator"; without devices, on purpose, unsloth's CPU backend is the honest choice.
NO_DEVICES_ENV = "STACKPIN_NO_DEVICES"
CPU_FALLBACK_ENV = "UNSLOTH_DISABLE_CPU_FALLBACK"


def environment_for(environ: dict[str, str]) -> dict[str, str]:
    """Studio's environment: unsloth's CPU backend allowed when run without devices."""
    env = dict(environ)
    if env.get(NO_DEVICES_ENV) == "1":
        env[CPU_FALLBACK_ENV] = "0"
    return env


def studio_run_py() -> Path:
    """studio/backend/run.py of the installed unsloth, or SystemExit with one line."""
    spec = importlib.util.find_spec("studio")
    locations = list(spec.submodule_search_locations or ()) if spec else []
    for folder in locations:
        run_py = Path(folder) / "backend" / "run.py"
        if run_py.is_file():
            return run_py
    sys.stderr.write(
        "stackpin serve: Unsloth Studio (studio/backend/run.py from the unsloth wheel) is not "
        "installed in this image: add unsloth to the cell's stack and rebuild\n"
    )
    raise SystemExit(3)


def main(argv: list[str]) -> int:
    run_py = studio_run_py()
    env = environment_for(dict(os.environ))
    if env.get(NO_DEVICES_ENV) == "1":
        print("stackpin serve: started without device flags (--no-devices): Studio runs on "
              "unsloth's CPU fallback", flush=True)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, str(run_py), *argv], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
