"""Studio's Train chain from the CPU image: a LoRA trained through its HTTP API, then chat.

`stackpin serve` runs the CPU image's Studio (its compatibility shims inside, pinning/cpu.toml
[compat]) with the seeded tiny model; scripts/gpu/studio-chain.py, the driver that proved
the chain on the H200 (docs/evidence/h200-studio/), drives it: login with the bootstrap
password, forced change, dataset upload, a 2-step LoRA run, status until completed, the
run in history, its checkpoint on disk, the adapter loaded and one chat with it. Every
answer it recorded is then checked here, not only its exit code.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, ROOT
from tests.integration.loopback import free_port
from tests.tools import default_sigint

from stackpin.engine import BindMount, RunRequest
from stackpin.engine.docker_api import DockerEngine

pytestmark = pytest.mark.docker

STATE_IN_CONTAINER = "/var/lib/stackpin/state"  # the service's state_dir (cpu.toml's default)
STEPS = 2


@pytest.fixture(scope="module")
def dataset(cpu_image, docker_engine: DockerEngine, tmp_path_factory) -> Path:
    """The tiny chat dataset, written by the image itself (stackpin_verify.tinychat)."""
    folder = tmp_path_factory.mktemp("train-data")
    result = docker_engine.run_to_completion(RunRequest(
        image=str(cpu_image["image_id"]),
        command=("python", "-m", "stackpin_verify.tinychat", "dataset", "/out/data.jsonl",
                 "--rows", "64"),
        mounts=(BindMount(source=folder, target="/out"),), network_mode="none",
    ), timeout_s=300)
    assert result.exit_code == 0, result.logs[-3000:]
    return folder / "data.jsonl"


@pytest.fixture(scope="module")
def chain(cpu_image, tiny_models: Path, dataset: Path, tmp_path_factory) -> Iterator[dict]:
    """Serve Studio, run the Train chain against it; the answers it recorded, by step."""
    state = tmp_path_factory.mktemp("train-state")
    out = tmp_path_factory.mktemp("train-chain")
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "stackpin.cli.main", "serve", CPU_CELL, "--port", str(port),
         "--models", str(tiny_models), "--state", str(state)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=default_sigint)
    assert serve.stdout is not None
    try:
        output = []
        for line in serve.stdout:
            output.append(line.rstrip())
            if "Ctrl-C stops it" in line:  # the last line serve prints once healthy
                break
        assert any("healthy at" in line for line in output), "\n".join(output[-40:])
        driven = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "gpu" / "studio-chain.py"),
             "--base", f"http://127.0.0.1:{port}", "--state", str(state / "studio"),
             "--model", "/workspace/models/tiny", "--dataset", str(dataset), "--out", str(out),
             "--steps", str(STEPS), "--host-path", f"{STATE_IN_CONTAINER}={state}",
             "--health-timeout", "600", "--train-timeout", "1200"],
            capture_output=True, text=True, timeout=2400, check=False)
        answers = json.loads((out / "answers.json").read_text())
        yield {"returncode": driven.returncode, "output": driven.stdout + driven.stderr,
               **{step["step"]: step for step in answers}}
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=120)


def test_the_chain_completes(chain):
    assert chain["returncode"] == 0, chain["output"][-4000:]


def test_a_two_step_lora_run_trains_to_completion(chain):
    start = chain["train_start"]
    assert start["request"]["training_type"] == "LoRA/QLoRA"
    assert start["request"]["max_steps"] == STEPS
    status = chain["train_status"]
    assert status["phases"][-1] == "completed", status
    # The chain polls the phase: two CPU steps can begin and end between two polls (seen in
    # CI: configuring, loading_model, completed), so "training" is not required to be seen;
    # a loss for each step is what says it trained.
    assert not {"error", "failed", "stopped"} & set(status["phases"]), status
    losses = chain["train_metrics"]["body"]
    assert len([loss for loss in losses.get("loss_history", []) if loss is not None]) == STEPS


def test_the_run_is_in_history_with_its_checkpoint_on_disk(chain):
    job_id = chain["train_start"]["body"]["job_id"]
    (listed,) = [run for run in chain["train_runs"]["body"]["runs"] if run["id"] == job_id]
    assert listed["status"] == "completed"
    assert listed["final_step"] == STEPS
    files = chain["output_files"]["files"]
    assert "adapter_model.safetensors" in files
    assert any(name.startswith(f"checkpoint-{STEPS}/") for name in files), files


def test_chat_answers_with_the_trained_adapter(chain):
    load = chain["inference_load"]
    assert load["request"]["is_lora"] is True
    assert load["body"]["status"] == "loaded"
    reply = chain["chat"]["body"]
    assert reply["object"] == "chat.completion"
    assert reply["usage"]["completion_tokens"] >= 1
