"""One torchrun worker for L7: an all-reduce and one DDP step, results written by rank 0.

Run as ``python -m torch.distributed.run --standalone --nproc_per_node N -m
stackpin_verify.ddp_worker --out FILE``; the backend comes from ``--backend``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from stackpin_verify.torchnames import CPU, GLOO, GPU


def device_for(backend: str) -> torch.device:
    if backend != GLOO:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        return torch.device(GPU, local_rank)
    return torch.device(CPU)


def allreduce(device: torch.device) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    return {
        "world_size": world,
        "expected": expected,
        "max_abs_err": float((tensor - expected).abs().max()),
    }


def _model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)  # identical initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(
        device
    )


def _flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def ddp_step(device: torch.device) -> dict[str, Any]:
    """Each rank sees different data; after backward DDP must leave every rank the mean of
    the local gradients, and after the step identical weights."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator(device=CPU).manual_seed(100 + rank)
    inputs = torch.randn(16, 32, generator=gen).to(device)
    local = _model(device)
    local(inputs).pow(2).mean().backward()
    expected = _flat_grads(local)
    dist.all_reduce(expected)
    expected /= world

    model = DistributedDataParallel(
        _model(device), device_ids=[device.index] if device.type == GPU else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(inputs).pow(2).mean()
    loss.backward()
    grads = _flat_grads(model.module)
    gathered = [torch.empty_like(grads) for _ in range(world)]
    dist.all_gather(gathered, grads)
    optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    all_weights = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(all_weights, weights)
    return {
        "world_size": world,
        "grad_norm": float(grads.norm()),
        "grad_rank_diff": max(float((g - gathered[0]).abs().max()) for g in gathered),
        "grad_vs_mean_diff": float((grads - expected).abs().max()),
        "weight_rank_diff": max(float((w - all_weights[0]).abs().max()) for w in all_weights),
        "loss": float(loss.detach()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    try:
        device = device_for(args.backend)
        result = {"backend": args.backend, "allreduce": allreduce(device), "ddp": ddp_step(device)}
        if dist.get_rank() == 0:
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result), encoding="utf-8")
            tmp.replace(args.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
