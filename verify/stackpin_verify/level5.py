"""L5 training: LoRA through peft on a tiny Qwen2 model, greedy recall of what it learned,
adapter round trip, a full step, and the same through unsloth where it is installed on an
accelerator."""

from __future__ import annotations

import functools
import importlib.util
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stackpin_verify import batched, lora_tensors, step_timing, tinylm, training
from stackpin_verify.checks import CheckFailed, CheckResult, Metrics, Skip, require, run_check
from stackpin_verify.context import Context, tiny_work_threads

LORA_STEPS = 80
LORA_LR = 1e-2
FULL_LR = 1e-3
# Room past the longest answer so a model that never stops shows its repetition.
EXTRA_TOKENS = 8


@dataclass
class LoraSession:
    """State shared by the L5 checks (trained once per run)."""

    tokenizer: Any
    config: Any
    batch: tinylm.Batch
    base_state: dict[str, torch.Tensor]
    model: Any
    trainable: int
    expected: int
    trace: training.Trace | None = None
    # Each adapter tensor before training (lora_tensors judges how far each moved).
    initial: dict[str, torch.Tensor] | None = None


def run(ctx: Context) -> list[CheckResult]:
    with tiny_work_threads(ctx.device):
        results = [
            run_check("L5.data.padding_labels", functools.partial(check_padding_labels, ctx)),
            run_check("L5.lora.attach", functools.partial(check_lora_attach, ctx)),
            run_check("L5.lora.train", functools.partial(check_lora_train, ctx)),
            run_check("L5.lora.recall", functools.partial(check_lora_recall, ctx)),
            run_check("L5.lora.adapter_roundtrip", functools.partial(check_adapter_roundtrip, ctx)),
            *tensor_checks(ctx),
            run_check("L5.full_step", functools.partial(check_full_step, ctx)),
            # Stable versus enhanced: a step with each attention (issue 20).
            run_check(step_timing.CHECK, functools.partial(step_timing.check, ctx), required=False),
        ]
    # Last: importing unsloth patches transformers for the rest of the process.
    results.append(run_check("L5.unsloth", functools.partial(check_unsloth, ctx), required=False))
    from stackpin_verify.level5_cpu import check_unsloth_cpu  # imports this module

    # Required where it runs: the CPU cell declares that unsloth's CPU backend trains.
    results.append(run_check("L5.unsloth_cpu", functools.partial(check_unsloth_cpu, ctx)))
    return results


def need_stack(ctx: Context) -> None:
    for name in ("transformers", "tokenizers", "peft"):
        ctx.need_module(name)


def check_padding_labels(ctx: Context, collate: tinylm.Collate = tinylm.collate) -> Metrics:
    """``collate`` is replaceable so a broken collator can be shown to fail here."""
    ctx.need_module("transformers")
    tokenizer = tinylm.build_tokenizer()
    batch = collate(tokenizer, tinylm.GOLDEN, ctx.device)
    padded = int((batch["attention_mask"] == 0).sum())
    metrics: Metrics = {"padding_positions": padded, "shape": list(batch["input_ids"].shape)}
    require(training.judge_padding(batch, pad_id=tokenizer.pad_token_id), metrics)
    return metrics


def attach_lora(model: Any, targets: Sequence[str]) -> Any:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=tinylm.LORA_RANK,
        lora_alpha=2 * tinylm.LORA_RANK,
        lora_dropout=0.0,  # deterministic: the round trip compares logits exactly
        target_modules=list(targets),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        # peft refuses targets matching nothing; the field saw the silent variant too
        # (only lm_head trained, loss stuck at ln(vocab)), which the count check catches.
        msg = f"LoRA target_modules {list(targets)} matched no module: {exc}"
        raise CheckFailed(msg) from exc


def new_session(ctx: Context, targets: Sequence[str] = tinylm.LORA_TARGETS) -> LoraSession:
    need_stack(ctx)
    tokenizer = tinylm.build_tokenizer()
    config = tinylm.build_config(len(tokenizer))
    base = tinylm.build_model(config, dtype=ctx.train_dtype(), device=ctx.device)
    base_state = {k: v.detach().clone() for k, v in base.state_dict().items()}
    model = attach_lora(base, targets)
    return LoraSession(
        tokenizer=tokenizer,
        config=config,
        batch=tinylm.collate(tokenizer, tinylm.GOLDEN, ctx.device),
        base_state=base_state,
        model=model,
        trainable=tinylm.trainable_params(model),
        expected=tinylm.expected_lora_params(
            config, rank=tinylm.LORA_RANK, targets=tinylm.LORA_TARGETS
        ),
    )


def lora_session(ctx: Context) -> LoraSession:
    session = ctx.cache.get("lora")
    if session is None:
        session = new_session(ctx)
        ctx.cache["lora"] = session
    assert isinstance(session, LoraSession)
    return session


def check_lora_attach(ctx: Context, targets: Sequence[str] = tinylm.LORA_TARGETS) -> Metrics:
    session = (
        lora_session(ctx) if tuple(targets) == tinylm.LORA_TARGETS else (new_session(ctx, targets))
    )
    metrics: Metrics = {
        "trainable_params": session.trainable,
        "expected_params": session.expected,
        "targets": list(targets),
    }
    require(training.judge_trainable(session.trainable, session.expected), metrics)
    return metrics


def trained_session(ctx: Context) -> LoraSession:
    """Train once per run; the later L5 checks reuse the result."""
    session = lora_session(ctx)
    if session.trace is None:
        session.initial = lora_tensors.adapter_tensors(session.model)
        session.trace = training.train_steps(
            session.model, session.batch, steps=LORA_STEPS, lr=LORA_LR
        )
    return session


def trace_metrics(trace: training.Trace, trainable: int) -> Metrics:
    return {
        "loss_first": trace.losses[0] if trace.losses else None,
        "loss_last": trace.losses[-1] if trace.losses else None,
        "steps": len(trace.losses),
        "trainable_params": trainable,
        "grad_norm_min": min(trace.grad_norms) if trace.grad_norms else None,
    }


def check_lora_train(ctx: Context) -> Metrics:
    session = trained_session(ctx)
    assert session.trace is not None
    metrics = trace_metrics(session.trace, session.trainable)
    metrics["dtype"] = str(ctx.train_dtype()).removeprefix("torch.")
    require(training.judge_trainable(session.trainable, session.expected), metrics)
    require(training.judge_trace(session.trace), metrics)
    return metrics


@dataclass
class Recall:
    prompt: str
    expected: str
    text: str


def recall(
    model: Any, tokenizer: Any, cases: Sequence[tuple[str, str]], device: torch.device
) -> list[Recall]:
    found = []
    for prompt, expected in cases:
        ids, _ = tinylm.greedy_decode(
            model, tokenizer, prompt, max_new_tokens=len(expected) + EXTRA_TOKENS, device=device
        )
        found.append(Recall(prompt, expected, tokenizer.decode(ids, skip_special_tokens=True)))
    return found


def judge_recall(found: Sequence[Recall]) -> str | None:
    wrong = [r for r in found if r.text != r.expected]
    if not found or not wrong:
        return "nothing was generated" if not found else None
    shown = "; ".join(f"{r.prompt!r} -> {r.text!r} (expected {r.expected!r})" for r in wrong[:3])
    return f"{len(wrong)} of {len(found)} memorised answers differ: {shown}"


def check_lora_recall(ctx: Context, found: Sequence[Recall] | None = None) -> Metrics:
    """Greedy generation from the trained model reproduces the pairs it memorised: that the
    training took (L6 judges generation itself against a fixed model's golden answers)."""
    if found is None:
        session = trained_session(ctx)
        assert session.trace is not None
        reason = training.judge_trace(session.trace)
        if reason:
            msg = f"training (L5.lora.train) failed, nothing to recall: {reason}"
            raise CheckFailed(msg)
        found = recall(session.model, session.tokenizer, tinylm.GOLDEN, ctx.device)
    metrics: Metrics = {
        "cases": len(found),
        "exact": sum(r.text == r.expected for r in found),
        "outputs": [r.text for r in found],
    }
    require(judge_recall(found), metrics)
    return metrics


def check_adapter_roundtrip(ctx: Context) -> Metrics:
    from peft import PeftModel

    session = trained_session(ctx)
    with tempfile.TemporaryDirectory(prefix="stackpin-verify-") as tmp:
        session.model.save_pretrained(tmp)
        saved = sorted(p.name for p in Path(tmp).iterdir())
        base = tinylm.build_model(session.config, dtype=ctx.train_dtype(), device=ctx.device)
        base.load_state_dict(session.base_state)
        reloaded = PeftModel.from_pretrained(base, tmp).eval()
        roundtrip_tensors(session.model, reloaded, Path(tmp))
    with torch.no_grad():
        before = session.model(input_ids=session.batch["input_ids"]).logits
        after = reloaded(input_ids=session.batch["input_ids"]).logits
    diff = float((before.float() - after.float()).abs().max())
    metrics: Metrics = {"files": saved, "max_abs_diff": diff}
    if not torch.equal(before, after):
        msg = f"reloaded adapter gives different logits (max_abs_diff {diff:.3g})"
        raise CheckFailed(msg, metrics)
    return metrics


def roundtrip_tensors(trained: Any, reloaded: Any, directory: Path) -> None:
    """Each saved tensor against the trained one, then each reloaded one, before any
    output is compared: a file or a reload that loses one tensor is named."""
    want = lora_tensors.peft_state(trained)
    for what, got in (
        ("saved adapter file", lora_tensors.saved_tensors(directory)),
        ("reloaded adapter", lora_tensors.peft_state(reloaded)),
    ):
        reason = lora_tensors.judge_same_tensors(what, want, got)
        require(reason, {"tensors": len(want)})


# --- issue 22: every adapter tensor, the reload by layer, a left-padded batch -------------


def tensor_checks(ctx: Context) -> list[CheckResult]:
    return [
        run_check("L5.lora.tensors_learned", functools.partial(check_tensors_learned, ctx)),
        run_check("L5.lora.optimizer_steps", functools.partial(check_optimizer_steps, ctx)),
        run_check("L5.lora.adapter_layers", functools.partial(check_adapter_layers, ctx)),
        run_check("L5.lora.batched_generation", functools.partial(check_batched_lora, ctx)),
    ]


def check_tensors_learned(ctx: Context) -> Metrics:
    session = trained_session(ctx)
    assert session.initial is not None
    assert session.trace is not None
    trained = lora_tensors.adapter_tensors(session.model)
    steps = len(session.trace.losses)
    moves, reason = lora_tensors.judge_moved(session.initial, trained, lr=LORA_LR, steps=steps)
    metrics: Metrics = {
        "tensors": len(moves),
        "min_move": min(moves.values(), default=None),
        "max_move": max(moves.values(), default=None),
        "lower_bound": LORA_LR,
        "upper_bound": lora_tensors.ADAM_STEP_BOUND * LORA_LR * steps,
    }
    require(reason, metrics)
    return metrics


def check_optimizer_steps(ctx: Context) -> Metrics:
    session = trained_session(ctx)
    assert session.trace is not None
    names = [n for n, p in session.model.named_parameters() if p.requires_grad]
    counts = dict(zip(names, session.trace.optimizer_steps, strict=True))
    adapter = {n: c for n, c in counts.items() if n in (session.initial or {})}
    metrics: Metrics = {"tensors": len(adapter), "steps": LORA_STEPS}
    require(lora_tensors.judge_optimizer_steps(adapter, LORA_STEPS), metrics)
    return metrics


def check_adapter_layers(ctx: Context) -> Metrics:
    """Reload the adapter and drop each layer's part in turn: every layer must matter."""
    from peft import PeftModel

    session = trained_session(ctx)
    with tempfile.TemporaryDirectory(prefix="stackpin-verify-") as tmp:
        session.model.save_pretrained(tmp)
        base = tinylm.build_model(session.config, dtype=ctx.train_dtype(), device=ctx.device)
        base.load_state_dict(session.base_state)
        reloaded = PeftModel.from_pretrained(base, tmp).eval()
    ids = session.batch["input_ids"]
    moves, reason = lora_tensors.layer_ablation(reloaded, ids, ctx.train_dtype())
    metrics: Metrics = {"logit_moves": moves}
    require(reason, metrics)
    return metrics


def check_batched_lora(ctx: Context) -> Metrics:
    """The trained model answers the memorised prompts in one left-padded batch exactly as
    it answers each alone."""
    session = trained_session(ctx)
    tokenizer = session.tokenizer
    prompts = [tokenizer(prompt)["input_ids"] for prompt, _ in tinylm.GOLDEN]
    steps = max(len(answer) for _, answer in tinylm.GOLDEN) + EXTRA_TOKENS
    metrics, reason = batched.compare(
        session.model,
        prompts,
        [prompt for prompt, _ in tinylm.GOLDEN],
        steps,
        pad_id=tokenizer.pad_token_id,
        device=ctx.device,
        eos_id=tokenizer.eos_token_id,
    )
    require(reason, metrics)
    return metrics


def check_full_step(ctx: Context) -> Metrics:
    need_stack(ctx)
    session = lora_session(ctx)
    model = tinylm.build_model(session.config, dtype=ctx.train_dtype(), device=ctx.device)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trace = training.train_steps(model, session.batch, steps=1, lr=FULL_LR)
    with torch.no_grad():
        loss_after = float(model(**session.batch).loss)
    changed = sum(not torch.equal(before[k], v) for k, v in model.named_parameters())
    metrics = trace_metrics(trace, tinylm.trainable_params(model))
    metrics.update(loss_after=loss_after, changed_tensors=changed, tensors=len(before))
    require(training.judge_trace(trace, min_drop=1.0), metrics)
    if changed == 0 or not loss_after < trace.losses[0]:
        msg = (
            f"one full step changed {changed} tensors; "
            f"loss {trace.losses[0]:.4g} -> {loss_after:.4g}"
        )
        raise CheckFailed(msg, metrics)
    return metrics


def save_tiny_base(ctx: Context, session: LoraSession, folder: str) -> None:
    """The session's untrained tiny model and tokenizer as a model folder, what a loader
    (unsloth's, Studio's) reads from disk."""
    base = tinylm.build_model(session.config, dtype=ctx.train_dtype(), device=ctx.device)
    base.save_pretrained(folder)
    session.tokenizer.save_pretrained(folder)


def check_unsloth(ctx: Context) -> Metrics:
    if importlib.util.find_spec("unsloth") is None:
        msg = "unsloth is not installed"
        raise Skip(msg)
    if not ctx.accelerated:
        msg = "no accelerator: L5.unsloth_cpu trains unsloth's CPU backend"
        raise Skip(msg)
    session = lora_session(ctx)
    with tempfile.TemporaryDirectory(prefix="stackpin-verify-") as tmp:
        save_tiny_base(ctx, session, tmp)
        model = _unsloth_lora(ctx, tmp)
    trace = training.train_steps(model, session.batch, steps=LORA_STEPS, lr=LORA_LR)
    metrics = trace_metrics(trace, tinylm.trainable_params(model))
    require(training.judge_trainable(metrics["trainable_params"], session.expected), metrics)
    require(training.judge_trace(trace), metrics)
    return metrics


def _unsloth_lora(ctx: Context, path: str) -> Any:
    from unsloth import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(
        model_name=path,
        max_seq_length=64,
        dtype=ctx.train_dtype(),
        load_in_4bit=False,
        local_files_only=True,
    )
    return FastLanguageModel.get_peft_model(
        model,
        r=tinylm.LORA_RANK,
        lora_alpha=2 * tinylm.LORA_RANK,
        lora_dropout=0.0,
        target_modules=list(tinylm.LORA_TARGETS),
        use_gradient_checkpointing=False,
        random_state=tinylm.SEED,
    )
