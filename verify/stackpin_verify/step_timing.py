"""L5.variants.train_step: one LoRA training step (forward, backward, AdamW) of a Qwen2
model with SDPA's default backend (stable) and with the image's attention package
(enhanced), same weights, same batch.

The package enters through transformers' ``AttentionInterface`` under its own name, one
path for FlashAttention 2 and 4 and for every transformers the cells pin (4.57 knows no
``flash_attention_4``). The batch has no padding, so transformers passes no mask and the
causal flag alone masks, as in its own flash path. Both models must compute the same
logits before training (``LOGITS_AGREEMENT``): a switch that broke the attention would
otherwise time as a win. The loss cannot tell: at initialisation it sits near ln(vocab)
whatever the attention computes.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stackpin_verify import attn_package, recommend, tinylm, workload
from stackpin_verify.bench import Timer, select_timer
from stackpin_verify.checks import CheckFailed, Metrics, Skip
from stackpin_verify.context import Context, synchronize

CHECK = "L5.variants.train_step"
ENHANCED_IMPLEMENTATION = "stackpin_attention_package"
# Mean |logits difference| / mean |logits| between the two attentions: bf16 rounding in two
# layers stays near 1e-2 of it; a wrong mask, scale or layout moves every logit.
LOGITS_AGREEMENT = 0.05


@dataclass(frozen=True)
class SpeedModel:
    """A two-layer Qwen2 with the workload's attention (``stackpin_verify.workload``: 16 heads
    of 128, GQA 4:1) on its first training batch (Studio's defaults, 4 x 2048 tokens):
    attention is about a third of the step, as in the models users tune."""

    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    layers: int
    vocab: int
    batch: int
    seqlen: int

    @classmethod
    def declared(cls) -> SpeedModel:
        data = workload.declared()
        model, shape = data["train_model"], workload.train_shape(data)
        return cls(hidden=shape.heads * shape.head_dim, heads=shape.heads,
                   kv_heads=int(data["kv_heads"]), intermediate=int(model["intermediate"]),
                   layers=int(model["layers"]), vocab=int(model["vocab"]), batch=shape.batch,
                   seqlen=shape.seqlen)

    def config(self, implementation: str) -> Any:
        config = _transformers("Qwen2Config")(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.seqlen,
            tie_word_embeddings=False,
            pad_token_id=0,
        )
        config._attn_implementation = implementation
        return config

    def describe(self) -> Metrics:
        return {
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.hidden // self.heads,
            "layers": self.layers,
            "batch": self.batch,
            "seqlen": self.seqlen,
        }


def check(ctx: Context) -> Metrics:
    if not ctx.accelerated:
        raise Skip(recommend.NO_DEVICE)
    for name in ("transformers", "peft"):
        ctx.need_module(name)
    package = attn_package.for_timing(ctx.image_field("attention"), recommend.NO_PACKAGE)
    timer = select_timer(ctx.device)
    return compare(package, SpeedModel.declared(), ctx.device, ctx.train_dtype(), timer)


def compare(
    package: attn_package.AttentionPackage,
    model: SpeedModel,
    device: torch.device,
    dtype: torch.dtype,
    timer: Timer,
) -> Metrics:
    register(package)
    batch = _batch(model, device)
    metrics: Metrics = {"package": package.label, "timer": timer.name, "model": model.describe()}
    metrics["dtype"] = str(dtype).removeprefix("torch.")
    logits: dict[str, torch.Tensor] = {}
    steps: dict[str, Callable[[], torch.Tensor]] = {}
    for side, implementation in (("stable", "sdpa"), ("enhanced", ENHANCED_IMPLEMENTATION)):
        try:
            lora = _lora_model(model.config(implementation), device, dtype)
            with torch.no_grad():
                logits[side] = lora(input_ids=batch["input_ids"]).logits.float()
            step = _train_step(lora, batch)
            metrics[f"{side}_first_step_ms"] = _first_step(step, device)
            steps[side] = step
        except Exception as exc:
            metrics["failed_side"] = "both" if "failed_side" in metrics else side
            metrics[f"{side}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if len(logits) == 2:
        metrics["logits_mean_rel_diff"] = mean_rel_diff(logits["enhanced"], logits["stable"])
    if len(steps) == 2:
        metrics.update(paired(steps, timer))
    judge(metrics)
    return metrics


# Attention is a few percent of this step (H200, FlashAttention 4: about 0.16 ms of 21 ms),
# and one side timed after the other drifted more than that between runs (stable 23.2 ms,
# then 21.9 ms). So the sides are timed in turns, stable-enhanced then enhanced-stable, an
# even number of rounds: a drift linear in time adds as much to either side's total, and
# the ratio is of the totals.
ROUNDS = 6


def paired(steps: dict[str, Callable[[], torch.Tensor]], timer: Timer) -> Metrics:
    times: dict[str, list[float]] = {"stable": [], "enhanced": []}
    for round_ in range(ROUNDS):
        order = ("stable", "enhanced") if round_ % 2 == 0 else ("enhanced", "stable")
        for side in order:
            times[side].append(timer.time_ms(steps[side]))
    stable, enhanced = (sum(times[side]) / ROUNDS for side in ("stable", "enhanced"))
    return {"stable_ms": stable, "enhanced_ms": enhanced,
            "round_ratios": [e / s for s, e in zip(times["stable"], times["enhanced"],
                                                   strict=True)],
            "enhanced_over_stable": enhanced / stable}


def mean_rel_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().mean() / want.abs().mean().clamp_min(1e-30))


def judge(metrics: Metrics) -> None:
    """Fails (the check is optional) when a side failed, the losses disagree, or the
    enhanced step is slower: each is a line a person reads, never a quiet pass."""
    side = metrics.get("failed_side")
    if side is not None:
        errors = "; ".join(f"{s}: {metrics[f'{s}_error']}" for s in ("stable", "enhanced")
                           if f"{s}_error" in metrics)
        msg = f"the training step failed ({errors})"
        raise CheckFailed(msg, metrics)
    diff = metrics["logits_mean_rel_diff"]
    if not diff <= LOGITS_AGREEMENT:  # NaN fails too
        metrics["failed_side"] = "enhanced"
        msg = (f"logits with {metrics['package']} differ from SDPA's by {diff:.3g} of their "
               f"mean magnitude (limit {LOGITS_AGREEMENT:g}): its attention is wrong")
        raise CheckFailed(msg, metrics)
    ratio = metrics["enhanced_over_stable"]
    if ratio > 1.0 + recommend.TIE_BAND:
        msg = (f"enhanced is slower here: a LoRA step takes {metrics['enhanced_ms']:.3g} ms with "
               f"{metrics['package']}, {metrics['stable_ms']:.3g} ms with SDPA ({ratio:.2f}x)")
        raise CheckFailed(msg, metrics)


def register(package: attn_package.AttentionPackage) -> None:
    """Make ``package`` transformers' attention named ENHANCED_IMPLEMENTATION."""
    interface = _transformers("AttentionInterface")
    interface.register(ENHANCED_IMPLEMENTATION, attention_function(package))


def _transformers(name: str) -> Any:
    """A transformers class, typed Any: its stubs vary between the versions images pin."""
    return getattr(importlib.import_module("transformers"), name)


def attention_function(package: attn_package.AttentionPackage) -> Callable[..., Any]:
    """transformers' attention signature: [B, H, S, D] in, ([B, S, H, D], None) out."""

    def forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **_: Any,
    ) -> tuple[torch.Tensor, None]:
        if attention_mask is not None:
            msg = "the timing batch has no padding, yet transformers passed a mask"
            raise ValueError(msg)
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        causal = bool(getattr(module, "is_causal", True))
        return package.attend(q, k, v, causal=causal, softmax_scale=scaling), None

    return forward


def _batch(model: SpeedModel, device: torch.device) -> tinylm.Batch:
    gen = torch.Generator().manual_seed(tinylm.SEED)
    ids = torch.randint(1, model.vocab, (model.batch, model.seqlen), generator=gen)
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


def _lora_model(config: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """The same weights on both sides: build_model seeds before initialising."""
    from stackpin_verify.level5 import attach_lora

    return attach_lora(tinylm.build_model(config, dtype=dtype, device=device), tinylm.LORA_TARGETS)


def _train_step(model: Any, batch: tinylm.Batch) -> Callable[[], torch.Tensor]:
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)

    def step() -> torch.Tensor:
        loss: torch.Tensor = model(**batch).loss
        torch.autograd.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _first_step(step: Callable[[], Any], device: torch.device) -> float:
    """The first step's time, kept apart: FA4 compiles its backward kernels then."""
    synchronize(device)
    begin = time.perf_counter()
    step()
    synchronize(device)
    return (time.perf_counter() - begin) * 1e3
