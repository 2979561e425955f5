"""L7 distributed: torchrun with 2+ processes, an all-reduce and one DDP step.

The accelerator collective (``nccl``; RCCL underneath on ROCm/DTK) when two or more devices
are visible, otherwise gloo with two CPU processes so the level also runs in CI.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, require, run_check
from stackpin_verify.context import Context
from stackpin_verify.torchnames import GLOO, NCCL

TIMEOUT_S = 240
# gloo sums float32 exactly for small integers; DDP averages in the same order per rank.
GRAD_TOLERANCE = 1e-6


def run(ctx: Context) -> list[CheckResult]:
    return [
        run_check("L7.allreduce", functools.partial(check_allreduce, ctx)),
        run_check("L7.ddp_step", functools.partial(check_ddp_step, ctx)),
    ]


def choose_launch(device_count: int, collective: str = NCCL) -> tuple[str, int]:
    """Backend and process count: one process per device with the platform's collective
    (image.json's platform_facts) when 2+ are visible, else gloo with two CPU processes."""
    if device_count >= 2:
        return collective, device_count
    return GLOO, 2


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_command(backend: str, nproc: int, out: Path) -> list[str]:
    # Rendezvous on loopback by address, never by hostname: a container run with
    # --network none cannot resolve its own hostname, and --standalone advertises it.
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(_free_loopback_port()),
        "--local_addr", "127.0.0.1",
        "-m", "stackpin_verify.ddp_worker", "--backend", backend, "--out", str(out),
    ]  # fmt: skip


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    # gloo binds to the address its hostname resolves to unless told an interface; the
    # loopback device always exists, also without a network.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def run_torchrun(command: list[str], *, timeout_s: float) -> tuple[int, str]:
    """Run in a new session so a timeout kills torchrun and all its workers as a group
    (workers do not carry the launcher's name, dcu-facts: kill by process tree)."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_worker_env(),
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -1, f"timed out after {timeout_s:g} s\n{output}"
    return proc.returncode, output


def distributed_result(ctx: Context) -> dict[str, Any]:
    cached = ctx.cache.get("distributed")
    if cached is None:
        collective = str(ctx.platform_facts.get("collective") or NCCL)
        backend, nproc = choose_launch(torch.cuda.device_count() if ctx.accelerated else 0,
                                       collective)
        with tempfile.TemporaryDirectory(prefix="stackpin-verify-") as tmp:
            out = Path(tmp) / "ddp.json"
            code, output = run_torchrun(launch_command(backend, nproc, out), timeout_s=TIMEOUT_S)
            if code != 0 or not out.exists():
                tail = "\n".join(output.strip().splitlines()[-15:])
                cached = {"error": f"torchrun ({backend}, {nproc} processes) exited {code}: {tail}"}
            else:
                cached = json.loads(out.read_text(encoding="utf-8"))
                cached["nproc"] = nproc
        ctx.cache["distributed"] = cached
    assert isinstance(cached, dict)
    if "error" in cached:
        raise CheckFailed(str(cached["error"]))
    return cached


def judge_allreduce(result: dict[str, Any]) -> str | None:
    if result["max_abs_err"] != 0.0:
        return (
            f"all-reduce over {result['world_size']} ranks is off by {result['max_abs_err']:g} "
            f"(expected every element {result['expected']:g})"
        )
    return None


def check_allreduce(ctx: Context) -> Metrics:
    result = distributed_result(ctx)
    metrics: Metrics = {
        "backend": result["backend"],
        "nproc": result["nproc"],
        **result["allreduce"],
    }
    require(judge_allreduce(result["allreduce"]), metrics)
    return metrics


def judge_ddp(result: dict[str, Any], *, tolerance: float = GRAD_TOLERANCE) -> str | None:
    if not result["grad_norm"] > 0.0:
        return "DDP gradients are zero"
    for key, what in (
        ("grad_rank_diff", "gradients differ across ranks"),
        ("grad_vs_mean_diff", "gradients are not the mean of the ranks' local gradients"),
        ("weight_rank_diff", "weights differ across ranks after the step"),
    ):
        if not result[key] <= tolerance:
            return f"{what} by {result[key]:.3g} (tolerance {tolerance:g})"
    return None


def check_ddp_step(ctx: Context) -> Metrics:
    result = distributed_result(ctx)
    metrics: Metrics = {"backend": result["backend"], "nproc": result["nproc"], **result["ddp"]}
    require(judge_ddp(result["ddp"]), metrics)
    return metrics
