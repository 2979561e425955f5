"""L5 on a host without an accelerator: LoRA through unsloth's CPU backend.

unsloth 2026.x falls back to ``unsloth_zoo.cpu`` (stock transformers, PEFT and TRL on
CPU) when it finds no accelerator and UNSLOTH_DISABLE_CPU_FALLBACK is not 1; the CPU cell
declares that its images train this way (Studio's Train API among them). The check loads
the tiny model through ``FastLanguageModel.from_pretrained`` as Studio's training worker
calls it (``on_model_resolved`` included), attaches LoRA with ``get_peft_model`` and
trains it; the loss must fall as for the peft check. Kept apart from level5.py's GPU check:
the accelerator path is unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Any

from stackpin_verify import tinylm, training
from stackpin_verify.checks import CheckFailed, Metrics, Skip, require
from stackpin_verify.context import Context
from stackpin_verify.level5 import (
    LORA_LR,
    LORA_STEPS,
    lora_session,
    save_tiny_base,
    trace_metrics,
)


def check_unsloth_cpu(ctx: Context) -> Metrics:
    if importlib.util.find_spec("unsloth") is None:
        msg = "unsloth is not installed"
        raise Skip(msg)
    if ctx.accelerated:
        msg = "an accelerator is present: L5.unsloth trains unsloth on it"
        raise Skip(msg)
    if os.environ.get("UNSLOTH_DISABLE_CPU_FALLBACK") == "1":
        msg = "UNSLOTH_DISABLE_CPU_FALLBACK=1 turns unsloth's CPU backend off in this image"
        raise Skip(msg)
    session = lora_session(ctx)
    with tempfile.TemporaryDirectory(prefix="stackpin-verify-") as tmp:
        save_tiny_base(ctx, session, tmp)
        model, resolved = _cpu_lora(ctx, tmp)
    if resolved != [tmp]:
        msg = f"on_model_resolved was called with {resolved}, not once with the model folder"
        raise CheckFailed(msg, {"resolved": resolved})
    backend = type(model.get_base_model()).__module__
    trace = training.train_steps(model, session.batch, steps=LORA_STEPS, lr=LORA_LR)
    metrics = trace_metrics(trace, tinylm.trainable_params(model))
    metrics["loader"] = _loader_module()
    metrics["base_model_module"] = backend
    if metrics["loader"] != "unsloth_zoo.cpu.loader":
        msg = f"FastLanguageModel came from {metrics['loader']}, not unsloth's CPU backend"
        raise CheckFailed(msg, metrics)
    require(training.judge_trainable(metrics["trainable_params"], session.expected), metrics)
    require(training.judge_trace(trace), metrics)
    return metrics


def _cpu_lora(ctx: Context, path: str) -> tuple[Any, list[str]]:
    from unsloth import FastLanguageModel

    resolved: list[str] = []
    model, _ = FastLanguageModel.from_pretrained(
        model_name=path, max_seq_length=64, dtype=ctx.train_dtype(), load_in_4bit=False,
        local_files_only=True, on_model_resolved=resolved.append,
    )
    model = FastLanguageModel.get_peft_model(
        model, r=tinylm.LORA_RANK, lora_alpha=2 * tinylm.LORA_RANK, lora_dropout=0.0,
        target_modules=list(tinylm.LORA_TARGETS), use_gradient_checkpointing=False,
        random_state=tinylm.SEED,
    )
    return model, resolved


def _loader_module() -> str:
    """The module whose from_pretrained FastLanguageModel runs (the CPU loader's, or not)."""
    from unsloth import FastLanguageModel

    for klass in FastLanguageModel.__mro__:
        if "from_pretrained" in vars(klass):
            return str(klass.__module__)
    return "unknown"
