#!/usr/bin/env python3
"""Drive Unsloth Studio's Train chain over HTTP, as the seed describes it, and record every
answer: health -> login with the bootstrap password -> forced password change -> dataset
upload -> POST /api/train/start (LoRA, local tiny model) -> status until completed (GPU
utilisation sampled from /api/train/hardware) -> metrics -> GET /api/train/runs lists the
run -> checkpoint on disk -> /api/inference/load of the adapter (is_lora) -> one
/v1/chat/completions.

Standard library only, so it runs on a bare GPU host beside the server. Every answer goes to
OUT/answers.json (written after each step, so a failure keeps what came before). Studio
reports some failures inside 200 bodies (`_deferred_error`), so bodies are checked too.

Usage: studio-chain.py --base http://127.0.0.1:8899 --state STUDIO_HOME --model DIR
                       --dataset FILE.jsonl --out DIR [--steps 30]
                       [--host-path SERVER_PREFIX=HOST_PREFIX]
(--model is the folder as the server sees it; --host-path maps the server's paths to this
host's, for a Studio in a container whose state folder is a bind mount.)
Exit codes: 0 the chain completed; 2 usage; 6 a step failed (the message names it).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TERMINAL = {"completed", "error", "stopped"}


class ChainError(Exception):
    """A step of the chain did not do what the seed says it does."""


def fail(message: str) -> NoReturn:
    raise ChainError(message)


class Recorder:
    """Keeps each step's request summary and answer; rewrites answers.json every step."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.steps: list[dict[str, Any]] = []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, step: str, **fields: Any) -> None:
        self.steps.append({"step": step, "t": round(time.time(), 3), **fields})
        (self.out / "answers.json").write_text(json.dumps(self.steps, indent=2) + "\n")
        print(f"[chain] {step}: {json.dumps(fields)[:400]}", flush=True)


class Client:
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self.token: str | None = None

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        content_type: str = "application/json",
        timeout: float = 600,
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, _decode(response.read())
        except urllib.error.HTTPError as error:
            return error.code, _decode(error.read())


def _decode(payload: bytes) -> Any:
    text = payload.decode("utf-8", "replace").strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def expect(status: int, body: Any, what: str) -> Any:
    """A 2xx with no deferred error, or ChainError naming the step and Studio's answer."""
    if not 200 <= status < 300:
        fail(f"{what}: HTTP {status}: {json.dumps(body)[:600]}")
    if isinstance(body, dict) and body.get("_deferred_error"):
        fail(f"{what}: deferred error in a {status} body: {body['_deferred_error']}")
    return body


def multipart(field: str, path: Path) -> tuple[bytes, str]:
    boundary = "stackpin" + secrets.token_hex(8)
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; '
        f'filename="{path.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    return head + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode(), (
        f"multipart/form-data; boundary={boundary}"
    )


def server_alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gpu_processes() -> list[str]:
    """nvidia-smi's compute processes (pid, name, memory), where nvidia-smi exists."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = [
        "nvidia-smi",
        "--query-compute-apps=pid,process_name,used_memory",
        "--format=csv,noheader",
    ]
    result = subprocess.run(query, capture_output=True, text=True, check=False, timeout=30)
    return [line for line in result.stdout.splitlines() if line.strip()]


def wait_healthy(client: Client, rec: Recorder, limit_s: float, pid: int | None) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if not server_alive(pid):
            fail(f"health: the server (pid {pid}) exited before it was healthy")
        try:
            status, body = client.call("GET", "/api/health", timeout=5)
        except OSError:
            time.sleep(1)
            continue
        if status == 200 and isinstance(body, dict) and body.get("status") == "healthy":
            rec.add("health", status=status, body=body)
            return
        time.sleep(1)
    fail(f"health: /api/health not healthy within {limit_s:.0f} s")


def login_and_change_password(client: Client, rec: Recorder, state: Path) -> None:
    bootstrap = (state / "auth" / ".bootstrap_password").read_text().strip()
    status, body = client.call(
        "POST", "/api/auth/login", {"username": "unsloth", "password": bootstrap}
    )
    expect(status, body, "login")
    rec.add("login", status=status, must_change_password=body.get("must_change_password"))
    if body.get("must_change_password") is not True:
        fail("login: the bootstrap login did not demand a password change")
    client.token = body["access_token"]
    status, blocked = client.call("GET", "/api/train/runs")
    rec.add("before_change", status=status, body=blocked)
    if status != 403:
        fail(f"before_change: expected 403 before the change, got {status}")
    new_password = "H200-proof-" + secrets.token_hex(8)
    status, body = client.call(
        "POST",
        "/api/auth/change-password",
        {"current_password": bootstrap, "new_password": new_password},
    )
    expect(status, body, "change-password")
    client.token = body["access_token"]
    rec.add(
        "change_password",
        status=status,
        bootstrap_file_left=(state / "auth" / ".bootstrap_password").exists(),
    )


def upload_dataset(client: Client, rec: Recorder, dataset: Path) -> str:
    raw, content_type = multipart("file", dataset)
    status, body = client.call(
        "POST", "/api/hub/datasets/upload", raw=raw, content_type=content_type
    )
    expect(status, body, "dataset upload")
    rec.add("upload", status=status, body=body)
    return str(body["stored_path"])


def start_training(
    client: Client, rec: Recorder, model: Path, stored: str, steps: int
) -> dict[str, Any]:
    request = {
        "model_name": str(model),
        "training_type": "LoRA/QLoRA",
        "format_type": "auto",
        "load_in_4bit": False,
        "max_seq_length": 256,
        "local_datasets": [stored],
        "max_steps": steps,
        "save_steps": max(1, steps // 2),
        "batch_size": 8,
        "gradient_accumulation_steps": 1,
        "learning_rate": "2e-3",
        "warmup_steps": 0,
        "optim": "adamw_torch",  # adamw_8bit needs bitsandbytes, which is not installed
        "lora_r": 16,
        "lora_alpha": 32,
        "target_modules": LORA_TARGETS,
        "random_seed": 3407,
        "project_name": "stackpin-h200-proof",
    }
    status, body = client.call("POST", "/api/train/start", request)
    expect(status, body, "train start")
    rec.add("train_start", status=status, request=request, body=body)
    return dict(body)


def poll_training(client: Client, rec: Recorder, limit_s: float) -> dict[str, Any]:
    """Status every 2 s until terminal; hardware snapshots (GPU memory) while it runs."""
    deadline = time.monotonic() + limit_s
    phases: list[str] = []
    hardware: list[Any] = []
    gpu_apps: list[str] = []
    body: Any = None
    while time.monotonic() < deadline:
        status, body = client.call("GET", "/api/train/status")
        expect(status, body, "train status")
        phase = str(body.get("phase") or body.get("status") or "")
        if not phases or phases[-1] != phase:
            phases.append(phase)
            print(f"[chain] phase {phase}: {json.dumps(body)[:300]}", flush=True)
        if phase == "training" or body.get("is_training_running"):
            hw_status, hw = client.call("GET", "/api/train/hardware")
            if hw_status == 200:
                hardware.append(hw)
            apps = gpu_processes()
            if apps:
                gpu_apps = apps
        if phase in TERMINAL:
            break
        time.sleep(2)
    rec.add(
        "train_status",
        phases=phases,
        final=body,
        hardware_samples=hardware[-3:],
        gpu_processes_while_training=gpu_apps,
    )
    if not phases or phases[-1] != "completed":
        fail(f"training did not complete: phases {phases}, last {body}")
    return dict(body)


def history(client: Client, rec: Recorder, job_id: str) -> dict[str, Any]:
    status, metrics = client.call("GET", "/api/train/metrics")
    expect(status, metrics, "train metrics")
    rec.add("train_metrics", status=status, body=metrics)
    status, runs = client.call("GET", "/api/train/runs")
    expect(status, runs, "train runs")
    rec.add("train_runs", status=status, body=runs)
    listed = [run for run in runs.get("runs", []) if run.get("id") == job_id]
    if not listed:
        fail(f"train runs: job {job_id} is not in the history {runs}")
    status, detail = client.call("GET", f"/api/train/runs/{job_id}")
    expect(status, detail, "train run detail")
    rec.add("train_run_detail", status=status, body=detail)
    return dict(listed[0])


def checkpoint_files(rec: Recorder, output_dir: Path) -> None:
    files = sorted(str(p.relative_to(output_dir)) for p in output_dir.rglob("*") if p.is_file())
    rec.add("output_files", output_dir=str(output_dir), files=files)
    if not any(f.startswith("checkpoint-") for f in files):
        fail(f"no checkpoint-N folder under {output_dir}")
    if "adapter_model.safetensors" not in files:
        fail(f"no adapter_model.safetensors in {output_dir}")


def preview_chat(client: Client, rec: Recorder, output_dir: Path) -> None:
    load = {
        "model_path": str(output_dir),
        "is_lora": True,
        "load_in_4bit": False,
        "max_seq_length": 256,
    }
    status, body = client.call("POST", "/api/inference/load", load)
    expect(status, body, "inference load (adapter)")
    rec.add("inference_load", status=status, request=load, body=body)
    if body.get("status") != "loaded":
        fail(f"inference load: status {body.get('status')!r}, not 'loaded'")
    status, inference = client.call("GET", "/api/inference/status")
    rec.add("inference_status", status=status, body=inference)
    model_id = body.get("model") or body.get("model_name") or str(output_dir)
    chat = {
        "model": model_id,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
        "temperature": 0,
    }
    status, reply = client.call("POST", "/v1/chat/completions", chat)
    expect(status, reply, "chat completion")
    rec.add("chat", status=status, request=chat, body=reply)
    message = reply.get("choices", [{}])[0].get("message", {})
    if reply.get("object") != "chat.completion" or "content" not in message:
        fail(f"chat: not an OpenAI chat.completion: {reply}")


def run(args: argparse.Namespace) -> None:
    client = Client(args.base)
    rec = Recorder(args.out)
    started = time.monotonic()
    wait_healthy(client, rec, args.health_timeout, args.server_pid)
    login_and_change_password(client, rec, args.state)
    status, hw = client.call("GET", "/api/train/hardware")
    rec.add("hardware_before", status=status, body=hw)
    stored = upload_dataset(client, rec, args.dataset)
    job = start_training(client, rec, args.model, stored, args.steps)
    t0 = time.monotonic()
    poll_training(client, rec, args.train_timeout)
    train_s = time.monotonic() - t0
    run_summary = history(client, rec, str(job["job_id"]))
    output_dir = Path(str(run_summary.get("output_dir") or ""))
    here = output_dir
    if args.host_path:
        server_prefix, _, host_prefix = args.host_path.partition("=")
        if output_dir.is_relative_to(server_prefix):
            here = Path(host_prefix) / output_dir.relative_to(server_prefix)
    if not here.is_dir():
        fail(f"history names no output folder on disk: {run_summary}")
    checkpoint_files(rec, here)
    preview_chat(client, rec, output_dir)
    chain_s = time.monotonic() - started
    rec.add("done", train_wall_s=round(train_s, 1), chain_wall_s=round(chain_s, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--state", type=Path, required=True, help="UNSLOTH_STUDIO_HOME")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--host-path", default="",
                        help="SERVER_PREFIX=HOST_PREFIX: where the server's files are here")
    parser.add_argument("--server-pid", type=int, help="stop waiting if this process exits")
    parser.add_argument("--health-timeout", type=float, default=180)
    parser.add_argument("--train-timeout", type=float, default=400)
    args = parser.parse_args(argv)
    try:
        run(args)
    except ChainError as error:
        print(f"studio-chain: {error}", file=sys.stderr)
        return 6
    return 0


if __name__ == "__main__":
    sys.exit(main())
