"""A tiny Qwen2-architecture model, a character tokenizer and a memorisation set, all built
in code: the verification must never download anything."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
ALPHABET = " abcdefghijklmnopqrstuvwxyz?."
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_RANK = 8
SEED = 0

# Prompt -> golden answer. Answers avoid repeated characters so the degenerate-output
# detector never fires on a correct answer; lengths differ so batches need padding.
GOLDEN: tuple[tuple[str, str], ...] = (
    ("capital of france?", " paris."),
    ("capital of japan?", " tokyo."),
    ("capital of peru?", " lima."),
    ("capital of norway?", " oslo."),
    ("two plus three?", " five."),
    ("color of the sky?", " blue."),
)

Batch = dict[str, torch.Tensor]


def _transformers(name: str) -> Any:
    """A transformers class, typed Any: its stubs vary between the versions images pin."""
    return getattr(importlib.import_module("transformers"), name)


def build_tokenizer() -> Any:
    """Character-level fast tokenizer from an in-memory WordLevel model."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    fast_tokenizer: Any = _transformers("PreTrainedTokenizerFast")

    vocab = {PAD: 0, EOS: 1, UNK: 2}
    vocab.update({char: index + 3 for index, char in enumerate(ALPHABET)})
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return fast_tokenizer(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def build_config(vocab_size: int) -> Any:
    return _transformers("Qwen2Config")(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query, like the Qwen2 models the field trains
        max_position_embeddings=64,
        tie_word_embeddings=False,
        # LoRA cannot touch the frozen lm_head or norms: with the default 0.02 init the
        # reachable logit margin is too small to memorise anything, so start wider.
        initializer_range=0.2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )


def build_model(config: Any, *, dtype: torch.dtype, device: torch.device) -> Any:
    torch.manual_seed(SEED)
    model = _transformers("Qwen2ForCausalLM")(config).to(dtype=dtype)
    model.config.use_cache = False
    return model.to(device)


def collate(tokenizer: Any, pairs: Sequence[tuple[str, str]], device: torch.device) -> Batch:
    """Right-padded batch of prompt+answer+eos; labels copy the ids with padding -> -100."""
    texts = [prompt + answer + EOS for prompt, answer in pairs]
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    labels = encoded["input_ids"].clone()
    labels[encoded["attention_mask"] == 0] = -100
    return {
        "input_ids": encoded["input_ids"].to(device),
        "attention_mask": encoded["attention_mask"].to(device),
        "labels": labels.to(device),
    }


Collate = Callable[[Any, Sequence[tuple[str, str]], torch.device], Batch]


def expected_lora_params(config: Any, *, rank: int, targets: Sequence[str]) -> int:
    """LoRA adds A (r x in) and B (out x r) per targeted Linear: r * (in + out), per layer."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_out = config.num_attention_heads * head_dim
    kv_out = config.num_key_value_heads * head_dim
    shapes = {
        "q_proj": (hidden, q_out),
        "k_proj": (hidden, kv_out),
        "v_proj": (hidden, kv_out),
        "o_proj": (q_out, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    per_layer = sum(rank * sum(shapes[t]) for t in targets if t in shapes)
    return int(per_layer * config.num_hidden_layers)


def trainable_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def greedy_decode(
    model: Any,
    tokenizer: Any,
    prompt: str,
    *,
    max_new_tokens: int,
    device: torch.device,
) -> tuple[list[int], list[torch.Tensor]]:
    """Argmax decoding without a KV cache (the model is tiny): returns the new token ids and
    the last-position logits of every step, which the NaN/Inf detector inspects."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
    new: list[int] = []
    step_logits: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=ids).logits[0, -1].float()
            step_logits.append(logits)
            token = int(logits.argmax())
            if token == tokenizer.eos_token_id:
                break
            new.append(token)
            ids = torch.cat([ids, torch.tensor([[token]], device=device)], dim=1)
    return new, step_logits
