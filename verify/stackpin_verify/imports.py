"""L0.imports: every module the image declares must import, each in a fresh interpreter.

"Installed" is not "importable": a wheel for another CUDA, a missing system library or a
package whose import patches others (unsloth patches transformers) fails only when
imported. Each module is imported in its own child interpreter, so one import's side
effects, or a crash in native code, cannot hide or cause another's result.

The children run at once, and from the start of the run (``start``): unsloth's and
FlashAttention 4's first imports took 51-78 s one after the other on the H200, the largest
share of L0-L6 there, while the suite's own process has other levels to run. The runner
judges the check when the other levels are done and reports it in L0 (runner.run_levels).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

from stackpin_verify.checks import Metrics, Skip, require
from stackpin_verify.context import Context

# unsloth refuses to import without an accelerator unless its CPU backend is allowed
# (Studio's run.py sets the opposite default); on a host with no device the import is
# judged on that backend, and the metrics say so.
_CPU_FALLBACK = {"UNSLOTH_DISABLE_CPU_FALLBACK": "0"}
_TIMEOUT_S = 600  # unsloth's first import compiles nothing but scans a large tree

_PROBE = "import importlib, sys; importlib.import_module(sys.argv[1])"


def import_env(environ: Mapping[str, str], *, accelerated: bool) -> dict[str, str]:
    """The child's environment: the image's, plus unsloth's CPU backend off a device."""
    env = dict(environ)
    if not accelerated:
        env.update(_CPU_FALLBACK)
    return env


def judge_imports(outcomes: Mapping[str, str | None]) -> str | None:
    """``outcomes``: module -> None when it imported, else the error it raised."""
    failed = [f"{module}: {error}" for module, error in sorted(outcomes.items()) if error]
    if failed:
        return "declared modules do not import: " + "; ".join(failed)
    return None


def import_one(module: str, env: Mapping[str, str]) -> str | None:
    """None when ``module`` imports in a fresh interpreter, else the last line of its error."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, module], env=dict(env),
                              capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"import did not finish in {_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit code {done.returncode}"


CHECK = "L0.imports"
Probes = dict[str, "concurrent.futures.Future[str | None]"]
_PENDING = "imports.pending"  # ctx.cache key of the probes start() launched
DEFERRED = "imports.deferred"  # ctx.cache key: the runner judges L0.imports after the levels


def declared_modules(ctx: Context) -> list[str]:
    return [str(m) for m in (ctx.image or {}).get("imports") or []]


def launch(modules: Sequence[str], env: Mapping[str, str]) -> Probes:
    """One child interpreter per module, all at once; each future gives import_one's answer."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(len(modules), 1),
                                                 thread_name_prefix="L0.imports")
    probes = {module: pool.submit(import_one, module, env) for module in modules}
    pool.shutdown(wait=False)
    return probes


def start(ctx: Context) -> bool:
    """Launch the declared modules' imports now, for check_imports to collect later; False
    when the image declares none (the check then skips as before)."""
    modules = declared_modules(ctx)
    if not modules:
        return False
    ctx.cache[_PENDING] = launch(modules, import_env(os.environ, accelerated=ctx.accelerated))
    return True


def check_imports(ctx: Context, modules: Sequence[str] | None = None) -> Metrics:
    declared = list(modules if modules is not None else declared_modules(ctx))
    if not declared:
        msg = "the image declares no modules to import (no image info)"
        raise Skip(msg)
    probes: Probes | None = None if modules is not None else ctx.cache.pop(_PENDING, None)
    if probes is None or sorted(probes) != sorted(declared):
        probes = launch(declared, import_env(os.environ, accelerated=ctx.accelerated))
    outcomes = {module: probes[module].result() for module in declared}
    metrics: Metrics = {
        "modules": declared,
        "failed": sorted(m for m, e in outcomes.items() if e),
        "unsloth_backend": "device" if ctx.accelerated else "cpu fallback",
    }
    require(judge_imports(outcomes), metrics)
    return metrics
