"""The fixed tiny model L6 generates with: a Qwen2-architecture network whose weights come
from a documented integer generator, and the float64 reference that computed its golden
answers (`golden.py` writes them, `level6.py` checks a device against them).

Why these weights: every one is a small integer times a power of two (|k| <= 15, scaled by
2^-4 .. 2^-7), so fp32, bf16 (8 significant bits) and fp16 (11) hold each weight exactly and
the model under test is the same model in every dtype; only the arithmetic differs. They are
drawn with SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014; the generator Java's SplittableRandom uses), written out below in
plain Python, so no torch or Python RNG, and no version of either, can change them.

The reference is the Qwen2 forward pass written out in float64 torch operations (RMSNorm,
rotary embeddings with rotate-half, grouped-query causal attention, SwiGLU MLP); the unit
tests check that transformers' `Qwen2ForCausalLM` in float64 agrees with it.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_MASK64 = (1 << 64) - 1
GOLDEN_RATIO_64 = 0x9E3779B97F4A7C15
WEIGHT_BOUND = 15  # integers in [-15, 15]: 5 significant bits, exact in bf16 and fp16
ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789.,?!-:;'()"  # 48 tokens, for display


@dataclass(frozen=True)
class Shape:
    vocab: int = len(ALPHABET)
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2  # grouped-query, like the Qwen2 models the field serves
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    max_positions: int = 64

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPE = Shape()


def splitmix64(state: int) -> tuple[int, int]:
    """One SplitMix64 step: the next state and the 64-bit output."""
    state = (state + GOLDEN_RATIO_64) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


class IntStream:
    """Integers in [-bound, bound] from SplitMix64 outputs (output mod (2*bound+1), minus
    bound: the modulo bias, under 2^-59, is irrelevant here and keeps the rule one line)."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK64

    def raw(self) -> int:
        self.state, out = splitmix64(self.state)
        return out

    def ints(self, count: int, bound: int) -> list[int]:
        return [self.raw() % (2 * bound + 1) - bound for _ in range(count)]

    def below(self, count: int, limit: int) -> list[int]:
        return [self.raw() % limit for _ in range(count)]


def tensor_plan(shape: Shape = SHAPE) -> Iterator[tuple[str, tuple[int, ...], int | None]]:
    """(state-dict name, shape, power-of-two scale exponent or None for all ones), in the
    order the generator fills them. Scales keep each matrix near 1/sqrt(fan-in)."""
    hd, h = shape.head_dim, shape.hidden
    yield "model.embed_tokens.weight", (shape.vocab, h), 4
    for layer in range(shape.layers):
        p = f"model.layers.{layer}."
        for proj, rows in (("q", shape.heads * hd), ("k", shape.kv_heads * hd)):
            yield f"{p}self_attn.{proj}_proj.weight", (rows, h), 6
            yield f"{p}self_attn.{proj}_proj.bias", (rows,), 6
        yield f"{p}self_attn.v_proj.weight", (shape.kv_heads * hd, h), 6
        yield f"{p}self_attn.v_proj.bias", (shape.kv_heads * hd,), 6
        yield f"{p}self_attn.o_proj.weight", (h, shape.heads * hd), 6
        yield f"{p}mlp.gate_proj.weight", (shape.intermediate, h), 6
        yield f"{p}mlp.up_proj.weight", (shape.intermediate, h), 6
        yield f"{p}mlp.down_proj.weight", (h, shape.intermediate), 7
        yield f"{p}input_layernorm.weight", (h,), None
        yield f"{p}post_attention_layernorm.weight", (h,), None
    yield "model.norm.weight", (h,), None
    yield "lm_head.weight", (shape.vocab, h), 4


def weights(seed: int, shape: Shape = SHAPE) -> dict[str, torch.Tensor]:
    """The state dict for `seed`, in float64 (every value is exact in bf16 and fp16)."""
    stream = IntStream(seed)
    found = {}
    for name, dims, exponent in tensor_plan(shape):
        if exponent is None:
            found[name] = torch.ones(dims, dtype=torch.float64)
            continue
        values = stream.ints(math.prod(dims), WEIGHT_BOUND)
        found[name] = torch.tensor(values, dtype=torch.float64).reshape(dims) / 2**exponent
    return found


# --- the float64 reference ------------------------------------------------------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def _rotary(length: int, shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    hd = shape.head_dim
    inv_freq = 1.0 / shape.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]
    both = torch.cat([angles, angles], dim=-1)
    return both.cos(), both.sin()


def _attention(w: dict[str, torch.Tensor], p: str, h: torch.Tensor, shape: Shape) -> torch.Tensor:
    length, hd = h.shape[0], shape.head_dim

    def project(name: str, heads: int) -> torch.Tensor:
        out = h @ w[f"{p}self_attn.{name}.weight"].T + w[f"{p}self_attn.{name}.bias"]
        return out.view(length, heads, hd).transpose(0, 1)

    q, k, v = (
        project(n, c)
        for n, c in (
            ("q_proj", shape.heads),
            ("k_proj", shape.kv_heads),
            ("v_proj", shape.kv_heads),
        )
    )
    cos, sin = _rotary(length, shape)
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    group = shape.heads // shape.kv_heads
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    scores = (q @ k.transpose(1, 2) / math.sqrt(hd)).masked_fill(future, -math.inf)
    mixed = torch.softmax(scores, dim=-1) @ v
    return mixed.transpose(0, 1).reshape(length, -1) @ w[f"{p}self_attn.o_proj.weight"].T


def reference_logits(
    w: dict[str, torch.Tensor], ids: Sequence[int], shape: Shape = SHAPE
) -> torch.Tensor:
    """Float64 logits at every position of `ids` ([len(ids), vocab])."""
    x = w["model.embed_tokens.weight"][list(ids)]
    for layer in range(shape.layers):
        p = f"model.layers.{layer}."
        x = x + _attention(
            w, p, _rms_norm(x, w[f"{p}input_layernorm.weight"], shape.rms_eps), shape
        )
        h = _rms_norm(x, w[f"{p}post_attention_layernorm.weight"], shape.rms_eps)
        gate = torch.nn.functional.silu(h @ w[f"{p}mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ w[f"{p}mlp.up_proj.weight"].T)) @ w[f"{p}mlp.down_proj.weight"].T
    return _rms_norm(x, w["model.norm.weight"], shape.rms_eps) @ w["lm_head.weight"].T


@dataclass
class Decoded:
    """Greedy continuation of one prompt: the chosen tokens and each step's logits."""

    tokens: list[int]
    logits: list[torch.Tensor]


def reference_greedy(w: dict[str, torch.Tensor], prompt: Sequence[int], steps: int) -> Decoded:
    ids, found = list(prompt), Decoded([], [])
    for _ in range(steps):
        row = reference_logits(w, ids)[-1]
        token = int(row.argmax())
        found.tokens.append(token)
        found.logits.append(row)
        ids.append(token)
    return found


def top1_margin(row: torch.Tensor) -> float:
    """How far the chosen logit stands above the runner-up."""
    best = row.double().topk(2).values
    return float(best[0] - best[1])


def text(tokens: Sequence[int]) -> str:
    return "".join(ALPHABET[t] if 0 <= t < len(ALPHABET) else "\ufffd" for t in tokens)


# --- the same model through transformers, on the device under test -----------------------------


def qwen2_config(shape: Shape = SHAPE) -> Any:
    config_class = importlib.import_module("transformers").Qwen2Config
    return config_class(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.rms_eps,
        tie_word_embeddings=False,
        use_sliding_window=False,
    )


def qwen2_model(w: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device) -> Any:
    """transformers' Qwen2ForCausalLM holding exactly `w` (strict: a renamed or missing
    tensor fails instead of keeping a random initialisation)."""
    model_class = importlib.import_module("transformers").Qwen2ForCausalLM
    model = model_class(qwen2_config())
    model.load_state_dict({name: t.to(torch.float32) for name, t in w.items()}, strict=True)
    return model.to(device=device, dtype=dtype).eval()


def device_greedy(
    model: Any, prompt: Sequence[int], steps: int, device: torch.device, *, kv_cache: bool
) -> Decoded:
    """Greedy decoding on the device: each step either re-runs the whole sequence, or
    (kv_cache) feeds one token against the cache the previous steps filled, as serving does."""
    ids = torch.tensor([list(prompt)], device=device)
    found, past, feed = Decoded([], []), None, ids
    with torch.no_grad():
        for _ in range(steps):
            if kv_cache:
                out = model(input_ids=feed, past_key_values=past, use_cache=True)
                past = out.past_key_values
            else:
                out = model(input_ids=ids, use_cache=False)
            row = out.logits[0, -1]
            token = int(row.argmax())
            found.tokens.append(token)
            found.logits.append(row)
            feed = torch.tensor([[token]], device=device)
            ids = torch.cat([ids, feed], dim=1)
    return found
