"""The tiny chat model and dataset: offline, deterministic, loadable the way Studio loads it."""

from __future__ import annotations

import hashlib
import json
import socket
import stat
from pathlib import Path

import pytest
import verify_helpers  # noqa: F401 - puts verify/ on sys.path
from transformers import AutoModelForCausalLM, AutoTokenizer

from stackpin_verify import tinychat


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Seed 0 twice and seed 1 once, written with every socket connection refused."""
    base = tmp_path_factory.mktemp("tinychat")
    with pytest.MonkeyPatch.context() as mp:

        def no_network(*_args: object, **_kwargs: object) -> None:
            message = "tinychat tried to open a network connection"
            raise AssertionError(message)

        mp.setattr(socket.socket, "connect", no_network)
        mp.setattr(socket, "create_connection", no_network)
        return {
            name: tinychat.write_model(base / name, seed=seed)
            for name, seed in (("a", 0), ("b", 0), ("other", 1))
        }


def test_same_seed_gives_same_bytes_other_seed_other_weights(model_dirs):
    a, b, other = (
        _digests(model_dirs["a"]),
        _digests(model_dirs["b"]),
        _digests(model_dirs["other"]),
    )
    assert set(a) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert a == b
    assert a["model.safetensors"] != other["model.safetensors"]


def test_tokenizer_class_keeps_studio_in_its_main_environment(model_dirs):
    config = json.loads((model_dirs["a"] / "tokenizer_config.json").read_text())
    # "TokenizersBackend" here makes Studio pip-install transformers sidecars at load time.
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "TokenizersBackend" not in (model_dirs["a"] / "tokenizer_config.json").read_text()


def test_files_are_readable_by_other_users(model_dirs):
    for path in model_dirs["a"].iterdir():
        assert path.stat().st_mode & stat.S_IROTH, path.name


def test_tokenizer_loads_renders_chatml_and_round_trips_any_text(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["a"])
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    text = "Grüße, 東京 🙂 tabs\tand\nnewlines"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert tokenizer.convert_tokens_to_ids(tinychat.IM_END) == tokenizer.eos_token_id
    assert 1000 < len(tokenizer) <= tinychat.VOCAB_SIZE + len(tinychat.SPECIAL_TOKENS)


def test_model_is_the_small_qwen2_and_generates(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["a"])
    model = AutoModelForCausalLM.from_pretrained(model_dirs["a"])
    config = model.config
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("qwen2", 64, 2)
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.pad_token_id == tokenizer.pad_token_id
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]


def test_writing_does_not_disturb_the_callers_rng(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tinychat.write_model(tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)


def test_dataset_rows_are_chat_messages_in_a_seeded_order(tmp_path):
    path = tinychat.write_dataset(tmp_path / "d" / "train.jsonl", rows=20, seed=0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 20
    answers = {answer for _question, answer in tinychat._FACTS}
    for row in rows:
        user, assistant = row["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert assistant["content"] in answers
    again = tinychat.write_dataset(tmp_path / "again.jsonl", rows=20, seed=0)
    assert again.read_bytes() == path.read_bytes()
    other = tinychat.write_dataset(tmp_path / "other.jsonl", rows=20, seed=1)
    assert other.read_bytes() != path.read_bytes()


def test_main_writes_dataset_and_refuses_zero_rows(tmp_path, capsys):
    assert tinychat.main(["dataset", str(tmp_path / "t.jsonl"), "--rows", "3"]) == 0
    assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 3
    assert tinychat.main(["dataset", str(tmp_path / "z.jsonl"), "--rows", "0"]) == 2
    assert "--rows must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "z.jsonl").exists()
    with pytest.raises(SystemExit) as usage:
        tinychat.main(["nonsense"])
    assert usage.value.code == 2
