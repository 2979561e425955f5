"""Where the attention time of issue 20's comparison goes, ON THE GPU HOST: for each shape of
the cell's declared workload (stackpin_verify.workload, the shapes L3.variants.attention
judges), both sides (FlashAttention 4 and SDPA's default backend), the very functions L3
times (attn_timing._prepared: [B, S, H, D] tensors, autograd.grad for fwd+bwd), measured
three ways:

- eager_ms: L3's own timer (triton.testing.do_bench): what L3.variants.attention reports;
- kernel_ms: the GPU time of the kernels one call launches (torch.profiler, summed over the
  device kernels of 20 calls, divided by 20): the work, without the host's launch cost;
- host_ms: host time per call with the GPU never waited on (20 calls queued, no sync):
  Python, dispatch and launch; when it exceeds kernel_ms, eager timing measures the host;
- queued_ms: what L3 now judges (bench.queued_timer: the stream held while the host queues
  every call, an L2 flush before each): it should read kernel_ms, and does not need a
  profiler.

Nothing here is judged: it says why a ratio is what it is. Usage (from the repository root,
with FlashAttention 4 importable): python scripts/gpu/attention-split.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "verify"))
from stackpin_verify import attn_package, attn_timing
from stackpin_verify.attention import make_qkv
from stackpin_verify.bench import queued_timer, select_timer

CALLS = 20


def kernel_ms(fn: Any) -> float:
    """Device time of the kernels of one call, from the profiler's kernel records."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    total_us = sum(e.device_time_total for e in prof.key_averages()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    return total_us / 1e3 / CALLS


def host_ms(fn: Any) -> float:
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(CALLS):
        fn()
    queued = time.perf_counter() - begin
    torch.cuda.synchronize()
    return queued * 1e3 / CALLS


def main(out: Path) -> None:
    device = torch.device("cuda")
    package = attn_package.discover()
    assert package is not None, "no FlashAttention importable"
    timer = select_timer(device)
    queued = queued_timer(device)
    assert queued is not None
    rows = []
    for shape in attn_timing.shapes():
        q, k, v = make_qkv(shape.dims, shape.dims, dtype=torch.bfloat16, device=device)

        def enhanced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     causal: bool = shape.causal) -> torch.Tensor:
            return package.attend(q, k, v, causal=causal)

        row: dict[str, Any] = {"shape": shape.describe()}
        for side, attend in (("enhanced", enhanced),
                             ("stable", attn_timing._sdpa_bshd(shape.causal))):
            fn, _, first = attn_timing._prepared(attend, (q, k, v), shape, device)
            row[side] = {"first_call_ms": round(first, 1),
                         "eager_ms": round(timer.time_ms(fn), 4),
                         "queued_ms": round(queued.time_ms(fn), 4),
                         "kernel_ms": round(kernel_ms(fn), 4),
                         "host_ms": round(host_ms(fn), 4)}
        for key in ("eager_ms", "queued_ms", "kernel_ms"):
            row[f"ratio_{key}"] = round(row["enhanced"][key] / row["stable"][key], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out.write_text(json.dumps({"package": package.label, "timer": timer.name,
                               "torch": torch.__version__,
                               "device": torch.cuda.get_device_name(), "rows": rows},
                              indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
