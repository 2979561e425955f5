"""Item 5 of issue 4: every injected fault is caught by the intended check, with a reason
that says what broke."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import verify_helpers
from tests.tools import need_module

from stackpin_verify import level0, level5, level6, tinylm, training
from stackpin_verify.checks import run_check
from stackpin_verify.context import tiny_work_threads

need_module("transformers")
need_module("peft")


# --- numpy 2 where the image forbids it -------------------------------------------------


def test_numpy2_fails_the_numpy_check_when_the_image_requires_numpy1(monkeypatch):
    monkeypatch.setattr(level0.environment, "dist_version", lambda dist: "2.1.3")
    ctx = verify_helpers.cpu_context(verify_helpers.image_info(numpy="<2"))
    result = run_check("L0.numpy", functools.partial(level0.check_numpy, ctx))
    assert result.status == "fail"
    assert "numpy 2.1.3 violates the image constraint numpy<2" in result.reason
    assert result.metrics == {"version": "2.1.3", "constraint": "<2"}


def test_installed_numpy1_passes_the_same_constraint():
    ctx = verify_helpers.cpu_context(verify_helpers.image_info(numpy="<2"))
    result = run_check("L0.numpy", functools.partial(level0.check_numpy, ctx))
    assert result.status == "pass", result.reason


# --- torch local label differing from the pin ---------------------------------------------


def test_torch_local_label_differing_from_the_pin_fails(monkeypatch):
    # pip swapped the vendor torch for an index build: both its metadata and its
    # runtime version say so.
    monkeypatch.setattr(torch, "__version__", "2.9.0+cu121")
    monkeypatch.setattr(level0.environment, "dist_version",
                        lambda dist: "2.9.0+cu121" if dist == "torch" else None)
    image = verify_helpers.image_info(torch="2.9.0+das.opt1.dtk2604", platform="dtk")
    ctx = verify_helpers.cpu_context(image)
    result = run_check("L0.torch_version", functools.partial(level0.check_torch_version, ctx))
    assert result.status == "fail"
    assert "local label 'cu121' vs pinned 'das.opt1.dtk2604'" in result.reason


def test_torch_without_a_local_label_is_not_the_vendor_build():
    reason = level0.judge_torch_version("2.9.0", "2.9.0+das.opt1.dtk2604")
    assert reason is not None
    assert "'<none>' vs pinned 'das.opt1.dtk2604'" in reason


# --- LoRA target_modules matching nothing ---------------------------------------------------


def test_lora_targets_matching_nothing_fail_the_attach_check():
    ctx = verify_helpers.cpu_context()
    attach = functools.partial(level5.check_lora_attach, ctx, targets=("qkv_proj",))
    result = run_check("L5.lora.attach", attach)
    assert result.status == "fail"
    assert "LoRA target_modules ['qkv_proj'] matched no module" in result.reason


def test_lora_on_attention_only_fails_the_expected_count():
    ctx = verify_helpers.cpu_context()
    attach = functools.partial(level5.check_lora_attach, ctx, targets=("q_proj", "v_proj"))
    result = run_check("L5.lora.attach", attach)
    assert result.status == "fail"
    assert result.metrics["trainable_params"] == 2 * 8 * ((64 + 64) + (64 + 32))
    assert "expected 16384 from the config" in result.reason


def test_expected_lora_count_follows_the_config():
    config = tinylm.build_config(32)
    # Per layer, r*(in+out): q 64->64, k and v 64->32, o 64->64, gate/up 64->128, down 128->64.
    per_layer = 8 * (128 + 96 + 96 + 128 + 192 + 192 + 192)
    assert tinylm.expected_lora_params(config, rank=8, targets=tinylm.LORA_TARGETS) == 2 * per_layer


# --- padding labels not masked ---------------------------------------------------------------


def _collate_without_masking(
    tokenizer: Any, pairs: Sequence[tuple[str, str]], device: torch.device
) -> tinylm.Batch:
    batch = tinylm.collate(tokenizer, pairs, device)
    batch["labels"] = batch["input_ids"].clone()
    return batch


def test_padding_labels_not_masked_fail_the_padding_check():
    ctx = verify_helpers.cpu_context()
    fn = functools.partial(level5.check_padding_labels, ctx, collate=_collate_without_masking)
    result = run_check("L5.data.padding_labels", fn)
    assert result.status == "fail"
    padded = result.metrics["padding_positions"]
    assert padded > 0
    assert f"{padded} padding positions have labels other than -100" in result.reason


def test_shipped_collator_masks_padding():
    ctx = verify_helpers.cpu_context()
    result = run_check(
        "L5.data.padding_labels", functools.partial(level5.check_padding_labels, ctx)
    )
    assert result.status == "pass", result.reason


# --- generation repeating one character -------------------------------------------------------


def _model_that_always_says(char: str) -> tuple[Any, Any]:
    tokenizer = tinylm.build_tokenizer()
    config = tinylm.build_config(len(tokenizer))
    model = tinylm.build_model(config, dtype=torch.float32, device=torch.device("cpu")).eval()
    favourite = tokenizer.convert_tokens_to_ids(char)
    with torch.no_grad():
        # The hidden state after the final norm is never all-zero, so a head with one
        # non-zero row (aligned with its sign) makes that token win every step.
        model.lm_head.weight.zero_()
        model.lm_head.bias = None
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight[favourite] = 1.0
    return model, tokenizer


def test_recall_from_a_model_repeating_one_character_fails():
    model, tokenizer = _model_that_always_says("a")
    found = level5.recall(model, tokenizer, tinylm.GOLDEN[:2], torch.device("cpu"))
    ctx = verify_helpers.cpu_context()
    recall = run_check("L5.lora.recall", functools.partial(level5.check_lora_recall, ctx, found))
    assert found[0].text.startswith("aaaaaa")
    assert recall.status == "fail"
    assert "2 of 2 memorised answers differ" in recall.reason
    assert level6.detect_degenerate(found[0].text, [4] * len(found[0].text)) is not None


def test_recall_with_nothing_generated_fails():
    assert level5.judge_recall([]) == "nothing was generated"


def test_degenerate_detector_spares_ordinary_answers():
    assert level6.detect_degenerate(" paris.", [3, 18, 4, 20, 12, 21, 30]) is None
    assert level6.detect_degenerate("", []) is None
    assert level6.detect_degenerate("abababab", [5] * 8) == "one token (id 5) repeated 8 times"


# --- NaN loss -----------------------------------------------------------------------------------


def test_nan_loss_fails_the_training_judge():
    tokenizer = tinylm.build_tokenizer()
    config = tinylm.build_config(len(tokenizer))
    model = tinylm.build_model(config, dtype=torch.float32, device=torch.device("cpu"))
    with torch.no_grad():
        model.model.embed_tokens.weight[5].fill_(float("nan"))
    batch = tinylm.collate(tokenizer, tinylm.GOLDEN, torch.device("cpu"))
    trace = training.train_steps(model, batch, steps=3, lr=1e-3)
    assert len(trace.losses) == 1  # the loop stops at the first non-finite loss
    assert training.judge_trace(trace) == "loss is not finite (nan) at step 0"


def test_nan_logits_fail_the_finite_logits_detector():
    logits = [torch.zeros(4), torch.tensor([0.0, float("nan"), float("inf"), 1.0])]
    assert level6.detect_nonfinite(logits) == (
        "logits at generation step 1 hold 1 NaN and 1 Inf values"
    )


def test_zero_gradient_and_flat_loss_fail_the_training_judge():
    flat = training.Trace(losses=[11.9, 11.9, 11.8], grad_norms=[0.3, 0.3, 0.3])
    reason = training.judge_trace(flat)
    assert reason is not None
    assert "loss fell from 11.9 to 11.8 in 3 steps" in reason
    frozen = training.Trace(losses=[4.0, 1.0], grad_norms=[0.5, 0.0])
    assert training.judge_trace(frozen) == "gradient norm is 0.0 at step 1: nothing is learning"


# --- adapter round trip: the reloaded adapter, not the trained model, is what is compared ---


def test_adapter_that_does_not_survive_the_reload_fails_the_round_trip(monkeypatch):
    """A round trip comparing the trained model with itself (or reloading nothing) would
    pass this; the check must compare with what came back from disk."""
    import peft

    real = peft.PeftModel.from_pretrained

    def reload_losing_lora_b(*args: Any, **kwargs: Any) -> Any:
        model = real(*args, **kwargs)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.zero_()
        return model

    monkeypatch.setattr(peft.PeftModel, "from_pretrained", reload_losing_lora_b)
    ctx = verify_helpers.cpu_context()
    with tiny_work_threads(ctx.device):
        result = run_check(
            "L5.lora.adapter_roundtrip", functools.partial(level5.check_adapter_roundtrip, ctx)
        )
    assert result.status == "fail"
    # Named tensor by tensor before any output is compared (issue 22).
    assert result.reason.startswith(
        "reloaded adapter (0 missing, 0 unexpected, 14 differ): differ: layers.0.mlp.down_proj.lora_B"
    )


def test_reload_with_the_same_tensors_but_other_logits_fails_on_the_logits(monkeypatch):
    # Every tensor survives but the reload scales the adapter twice as much (a lora_alpha
    # lost in the config): only the output comparison can see it.
    import peft

    real = peft.PeftModel.from_pretrained

    def reload_doubling_the_scale(*args: Any, **kwargs: Any) -> Any:
        model = real(*args, **kwargs)
        for module in model.modules():
            scaling = getattr(module, "scaling", None)
            if isinstance(scaling, dict):
                for adapter in scaling:
                    scaling[adapter] *= 2
        return model

    monkeypatch.setattr(peft.PeftModel, "from_pretrained", reload_doubling_the_scale)
    ctx = verify_helpers.cpu_context()
    with tiny_work_threads(ctx.device):
        result = run_check(
            "L5.lora.adapter_roundtrip", functools.partial(level5.check_adapter_roundtrip, ctx)
        )
    assert result.status == "fail"
    assert result.reason.startswith("reloaded adapter gives different logits")
    assert result.metrics["max_abs_diff"] > 0
