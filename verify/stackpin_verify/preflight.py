"""Before the suite imports torch in its own process: does ``import torch`` survive?

A truncated or wrong-architecture extension can kill the importing process outright (a
numpy ``_multiarray_umath`` cut to 4 KiB makes ``import torch`` die with SIGBUS, "Bus
error"): no check could run and no report would be written. So a child process imports
torch first; when it dies or fails, the run writes a report with one failing required
check, ``L0.import``, that says how, and exits 1.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from stackpin_verify.checks import CheckResult

PROBE = "import torch; torch.zeros(1)"
PROBE_TIMEOUT_S = 600


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with {code}"


def probe_import(timeout_s: int = PROBE_TIMEOUT_S) -> str | None:
    """Why ``import torch`` fails in a fresh interpreter, or None when it works."""
    command = [sys.executable, "-c", PROBE]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"python -c {PROBE!r} did not finish in {timeout_s} s"
    if done.returncode == 0:
        return None
    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
    return f"python -c {PROBE!r} {describe_exit(done.returncode)}" + (f": {tail}" if tail else "")


def import_failure(reason: str, duration_s: float) -> CheckResult:
    return CheckResult(
        name="L0.import",
        level=0,
        required=True,
        status="fail",
        reason=reason,
        duration_s=duration_s,
    )


def check_import() -> CheckResult | None:
    """The failing ``L0.import`` result, or None when torch imports."""
    start = time.perf_counter()
    reason = probe_import()
    return None if reason is None else import_failure(reason, time.perf_counter() - start)
