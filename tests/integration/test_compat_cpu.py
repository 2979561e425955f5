"""The CPU image's compatibility shims, each shown to be needed, in the real image.

Every shim the cell declares (pinning/cpu.toml, [compat]) is run against the upstream code
path it bridges: with the shim the call works, and with that shim alone switched off
(STACKPIN_COMPAT_OFF=<id>) the upstream failure the shim names comes back. A shim that
bridged nothing, or one that no longer applied, would fail here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stackpin.engine import BindMount, RunRequest
from stackpin.engine.docker_api import DockerEngine
from stackpin.matrix import Cell

pytestmark = pytest.mark.docker

CPU_CELL = "cpu-bookworm-torch2130-py311"
# What each shim's upstream path does in Studio's training worker, reduced to the call.
REPRODUCERS = {
    "trl-sftconfig-max-seq-length": (
        "from trl import SFTConfig\n"
        "config = SFTConfig(output_dir='/tmp/out', max_seq_length=64, report_to=[],"
        " use_cpu=True, bf16=False)\n"
        "assert config.max_length == 64, config.max_length\n",
        "unexpected keyword argument 'max_seq_length'",
    ),
    "unsloth-zoo-cpu-on-model-resolved": (
        "import unsloth\n"
        "from unsloth import FastLanguageModel\n"
        "seen = []\n"
        "model, tokenizer = FastLanguageModel.from_pretrained('/models/tiny', max_seq_length=64,"
        " load_in_4bit=False, on_model_resolved=seen.append)\n"
        "assert seen == ['/models/tiny'], seen\n",
        "unexpected keyword argument 'on_model_resolved'",
    ),
}


def _run(engine: DockerEngine, image: str, models: Path, script: str,
         environment: dict[str, str]) -> tuple[int, str]:
    result = engine.run_to_completion(RunRequest(
        image=image, command=("python", "-c", script),
        mounts=(BindMount(source=models, target="/models", read_only=True),),
        network_mode="none",
        environment={"UNSLOTH_DISABLE_CPU_FALLBACK": "0", **environment},
    ), timeout_s=900)
    return result.exit_code, result.logs


def test_the_cell_declares_exactly_the_shims_tested_here(shipped_cells: dict[str, Cell]):
    assert set(shipped_cells[CPU_CELL].compat) == set(REPRODUCERS)


def test_with_its_shims_the_image_runs_both_upstream_paths(cpu_image, docker_engine,
                                                           tiny_models: Path):
    script = "".join(code for code, _ in REPRODUCERS.values())
    script += ("import stackpin_compat\n"
               f"assert sorted(stackpin_compat.applied) == {sorted(REPRODUCERS)!r}, "
               "stackpin_compat.applied\n")
    code, logs = _run(docker_engine, str(cpu_image["image_id"]), tiny_models, script, {})
    assert code == 0, logs[-3000:]


@pytest.mark.parametrize("shim_id", sorted(REPRODUCERS))
def test_without_the_shim_the_defect_it_names_returns(cpu_image, docker_engine,
                                                      tiny_models: Path, shim_id: str):
    script, failure = REPRODUCERS[shim_id]
    code, logs = _run(docker_engine, str(cpu_image["image_id"]), tiny_models, script,
                      {"STACKPIN_COMPAT_OFF": shim_id})
    assert code != 0, logs[-3000:]
    assert failure in logs, logs[-3000:]
