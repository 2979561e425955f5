"""A tiny chat model and a tiny chat dataset, generated offline and deterministically.

Unsloth Studio (the service) needs a model folder to chat with and to train: a standard
Hugging Face folder (config, safetensors weights, tokenizer files with a chat template).
No tokenizer ships inside the installed packages and no hub is reachable, so this module
trains a small byte-level BPE on an in-code corpus and pairs it with a seeded random
Qwen2 (hidden 64, 2 layers). Its replies are gibberish; what it proves is the path through
the service (load, chat, LoRA train, adapter preview), not language.

It lives in verify/ because the service check runs inside images, where stackpin is not
installed; the same command serves tests on the host:

    PYTHONPATH=verify python -m stackpin_verify.tinychat model DIR [--seed N]
    PYTHONPATH=verify python -m stackpin_verify.tinychat dataset FILE.jsonl [--rows N] [--seed N]

The tokenizer is saved as `PreTrainedTokenizerFast`: a folder whose tokenizer_config names
`TokenizersBackend` (what transformers 5 writes by default) makes Studio install
transformers sidecar environments from the network at load time.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
VOCAB_SIZE = 2048  # a cap: this corpus stops merging near 1.2k tokens
MAX_POSITIONS = 2048
DEFAULT_SEED = 0
DEFAULT_ROWS = 64

# ChatML, as Qwen2 chat models use it; a system message is optional.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The corpus vocabulary: enough distinct words that BPE learns real merges.
_WORD_TEXT = (
    "the a an of to and in is it that for on with as was at by be this are from or have not "
    "but what all were when we there can more if no out so said up one about other into "
    "time has them some could make like him than first been its who now people my made over "
    "did down only way find use may water long little very after words called just where "
    "most know get through back much before go good new write our used me man too any day "
    "same right look think also around another came come work three word must because does "
    "part even place well such here take why things help put years different away again off "
    "went old number great tell men say small every found still between name should home big "
    "give air line set own under read last never us left end along while might next sound "
    "below saw something thought both few those always looked show large often together asked "
    "house world going want school important until form food keep children feet land side "
    "without boy once animals life enough took sometimes four head above kind began almost "
    "live page got earth need far hand high year mother light parts country father let night "
    "following picture being study second eyes soon times story boys since white days ever "
    "paper hard near sentence better best across during today others however sure means "
    "knew try told young miles sun ways thing whole hear example heard several change answer "
    "room sea against top turned learn point city play toward five using himself usually "
    "model train token chat reply question weight layer adapter loss step graph kernel cache "
    "paris tokyo lima oslo rome cairo delhi berlin madrid lisbon vienna prague dublin warsaw "
    "red blue green yellow orange purple black brown grey pink"
)
_WORDS = tuple(_WORD_TEXT.split())

# (question, answer) pairs for the training set: short, distinct, easy to read in a log.
_FACTS = (
    ("What is the capital of France?", "Paris."),
    ("What is the capital of Japan?", "Tokyo."),
    ("What is the capital of Peru?", "Lima."),
    ("What is the capital of Norway?", "Oslo."),
    ("What is the capital of Italy?", "Rome."),
    ("What is the capital of Egypt?", "Cairo."),
    ("What is the capital of Germany?", "Berlin."),
    ("What is the capital of Spain?", "Madrid."),
    ("What is two plus three?", "Five."),
    ("What is one plus one?", "Two."),
    ("What color is the sky?", "Blue."),
    ("What color is grass?", "Green."),
    ("How many days are in a week?", "Seven."),
    ("How many legs does a cat have?", "Four."),
    ("What do bees make?", "Honey."),
    ("What is frozen water called?", "Ice."),
)


def _transformers(name: str) -> Any:
    """A transformers class, typed Any: its stubs vary between the versions images pin."""
    return getattr(importlib.import_module("transformers"), name)


def corpus(seed: int = DEFAULT_SEED) -> Iterator[str]:
    """The BPE training text: seeded random sentences, the facts, and the chat framing."""
    rng = random.Random(seed)
    for _ in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        sentence = " ".join(words)
        yield sentence[0].upper() + sentence[1:] + rng.choice(".?!")
    for question, answer in _FACTS:
        yield f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n{answer}{IM_END}\n"


def build_tokenizer(seed: int = DEFAULT_SEED) -> Any:
    """A byte-level BPE (any text encodes, nothing maps to unknown) of at most VOCAB_SIZE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    """tokenizer_config.json, written by hand so the class and template are ours, not the
    installed transformers' defaults."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "additional_special_tokens": [IM_START, IM_END],
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": MAX_POSITIONS,
        "padding_side": "right",
        "clean_up_tokenization_spaces": False,
    }


def model_config(vocab_size: int, token_ids: dict[str, int]) -> Any:
    return _transformers("Qwen2Config")(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=token_ids[PAD_TOKEN],
        eos_token_id=token_ids[IM_END],
        pad_token_id=token_ids[PAD_TOKEN],
        torch_dtype="float32",
    )


def _seeded_model(config: Any, seed: int) -> Any:
    """Random weights from `seed`, without disturbing the caller's RNG state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _transformers("Qwen2ForCausalLM")(config)
    return model.to(dtype=torch.float32)


def write_model(dest: Path, *, seed: int = DEFAULT_SEED) -> Path:
    """Write the tiny chat model folder to `dest` (created; existing files are replaced)."""
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed)
    tokenizer.save(str(dest / "tokenizer.json"))
    token_ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    (dest / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2, sort_keys=True) + "\n"
    )
    (dest / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "eos_token": IM_END,
                "pad_token": PAD_TOKEN,
                "additional_special_tokens": [IM_START, IM_END],
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    config = model_config(tokenizer.get_vocab_size(with_added_tokens=True), token_ids)
    _seeded_model(config, seed).save_pretrained(str(dest), safe_serialization=True)
    for path in dest.iterdir():
        # transformers writes the weights 0600; a service in a container runs as another user.
        path.chmod(0o644)
    return dest


def dataset_rows(rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Chat rows in the `messages` format (user question, assistant answer), cycling the
    facts in a seeded order."""
    order = list(_FACTS)
    random.Random(seed).shuffle(order)
    return [
        {
            "messages": [
                {"role": "user", "content": order[i % len(order)][0]},
                {"role": "assistant", "content": order[i % len(order)][1]},
            ]
        }
        for i in range(rows)
    ]


def write_dataset(dest: Path, *, rows: int = DEFAULT_ROWS, seed: int = DEFAULT_SEED) -> Path:
    """Write the training set as JSON Lines (one row per line, keys sorted)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row, sort_keys=True) for row in dataset_rows(rows, seed)]
    dest.write_text("\n".join(lines) + "\n")
    return dest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stackpin_verify.tinychat",
        description="Write a tiny chat model folder or chat dataset, offline and seeded.",
    )
    sub = parser.add_subparsers(dest="what", required=True)
    model = sub.add_parser("model", help="write the model folder")
    model.add_argument("dest", type=Path)
    model.add_argument("--seed", type=int, default=DEFAULT_SEED)
    data = sub.add_parser("dataset", help="write the JSONL training set")
    data.add_argument("dest", type=Path)
    data.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    data.add_argument("--seed", type=int, default=DEFAULT_SEED)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes: 0 written, 2 usage (argparse, or a non-positive --rows)."""
    args = _parser().parse_args(argv)
    if args.what == "dataset":
        if args.rows < 1:
            print("tinychat: --rows must be at least 1", file=sys.stderr)
            return 2
        print(write_dataset(args.dest, rows=args.rows, seed=args.seed))
    else:
        print(write_model(args.dest, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
