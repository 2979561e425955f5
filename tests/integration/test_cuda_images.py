"""The CUDA cell's two images, built in CI on a host with no GPU (issue 20).

Both variants come from one build (``cuda_images``: BuildKit's one-stage Dockerfile) on the
matrix's Docker 28 engine with the classic store, whose BuildKit writes reproducible
timestamps itself: on Docker 20.10 the two 6.5 GB images would be normalised afterwards,
which took 5428 s for stable alone (docs/benchmarks.md), where this whole module costs
minutes. Without that engine (README command 1 sets up only the default one) the module
skips, and fails under CI=true, where scripts/setup-host.sh --engines runs. On this host:
the build guard passed (the build would have failed) and passes again inside each image,
and fails when told another torch; L0 passes inside each image; what needs a card
(L0.backend, L0.devices, the kernel levels L1-L7) says "unsupported: no device" and never
passes; the images hold what the lock says and nothing else (structure tests); the two share
every layer below the attention layer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra
from packaging.utils import canonicalize_name
from tests.conftest import CUDA_CELL, ROOT, stackpin_cli
from tests.integration.conftest import matrix_hosts
from tests.integration.loopback import get_json_in_netns, netns
from tests.tools import default_sigint, in_ci, missing

from stackpin.engine import RunRequest
from stackpin.engine.docker_api import DockerEngine
from stackpin.layers import install_layers
from stackpin.lock import read_lock
from stackpin.matrixfile import load_cells
from stackpin.normalize import SDE_LABEL
from stackpin.render import mount_stub_folders, stub_layer_names

# Its own lane of the Docker tier (scripts/test.sh runs two): it touches only its own engine,
# checkout copy, base and tags, so it runs beside the default engine's tests.
pytestmark = [pytest.mark.docker, pytest.mark.own_lane]

ENGINE = "docker28-classic"

VARIANTS = ("stable", "enhanced")
UNSUPPORTED = "unsupported: no device"


def _lock():  # type: ignore[no-untyped-def]
    lock = read_lock(ROOT, CUDA_CELL)
    assert lock is not None
    return lock


def variant_pins(variant: str) -> dict[str, str]:
    """What the variant's image installs: the lock less the attention layer in stable."""
    lock = _lock()
    skip = {"attention"} if variant == "stable" else set()
    return {w.name: w.version for w in lock.installed() if w.group not in skip}


@pytest.fixture(scope="module", autouse=True)
def cuda_engine() -> Iterator[DockerEngine]:
    """The Docker 28 classic-store engine, made every command's engine for this module."""
    host = dict(matrix_hosts()).get(ENGINE)
    if not host:
        missing(f"no {ENGINE} engine in the matrix (the CUDA images build there): run "
                "bash scripts/setup-host.sh --engines and export STACKPIN_ENGINES="
                '"$(bash scripts/setup-engines.sh --print-hosts)"')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", host)  # the CLI runs, `docker` and testinfra use it
        with DockerEngine.connect(environ={**os.environ, "DOCKER_HOST": host}) as engine:
            yield engine
            if in_ci():
                # About 7 GB of images (the two share all but the attention layer) and the
                # build cache: a CI machine gives them back before the tiers after this one
                # (a developer keeps them warm).
                subprocess.run(["docker", "image", "prune", "-af", "--filter",
                                f"label=io.stackpin.cell={CUDA_CELL}"], capture_output=True)
                subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True)


@pytest.fixture(scope="module")
def cuda_images(cuda_engine: DockerEngine, cpu_project: Path) -> dict[str, dict[str, object]]:
    """The CUDA cell's two images, built once through the real CLI in ``cpu_project``: the
    locked wheels fetched (the machine-wide wheel cache re-hashes and links what an earlier
    run downloaded), then ``build --variant all --builder buildkit``: the one-stage
    Dockerfile (wheels bind-mounted, the environment written once), the enhanced build
    reusing every layer below the attention layer. Needs no GPU: what needs a card is
    checked with --no-devices and must say "unsupported".

    Returns each variant's build record. A warm build reuses every layer, so a second
    session costs seconds.
    """
    for args in (("wheels", "fetch", CUDA_CELL),
                 ("build", CUDA_CELL, "--variant", "all", "--builder", "buildkit")):
        done = stackpin_cli(*args, cwd=cpu_project)
        assert done.returncode == 0, f"stackpin {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    records = cpu_project / "build" / "records"
    return {variant: dict(json.loads((records / f"{CUDA_CELL}-{variant}.json").read_text()))
            for variant in ("stable", "enhanced")}


def test_both_variants_are_buildkit_builds_sharing_every_layer_below_attention(
        cuda_images, cuda_engine: DockerEngine):
    stable, enhanced = (cuda_engine.image_info(str(cuda_images[v]["image_id"]))
                        for v in VARIANTS)
    assert stable is not None and enhanced is not None
    for variant in VARIANTS:
        record = cuda_images[variant]
        assert record["builder"] == "buildkit"
        # Reproducible either way: normalised afterwards (Docker 20.10), or written by the
        # engine's BuildKit (Docker 28); never "as built". Each image's creation time is its
        # source date epoch.
        assert record["timestamps"] in ("normalised", "native")
        assert record["lock_digest"] == _lock().digest
    for info in (stable, enhanced):
        epoch = int(info.labels[SDE_LABEL])
        assert info.created == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    base = cuda_engine.image_info(str(cuda_images["stable"]["base_id"]))
    assert base is not None
    shared = 0
    while stable.diff_ids[shared] == enhanced.diff_ids[shared]:
        shared += 1
    # The base, the mount stubs (the BuildKit Dockerfile's first step), the venv, the torch
    # (vendor) layer and the stack's layers (stackpin.layers); then enhanced's attention
    # layer is the first that differs, and stable has none.
    below = [x for x in install_layers(load_cells(sorted((ROOT / "pinning").glob("*.toml")))[
        CUDA_CELL], "enhanced", _lock()) if x.name != "attention"]
    assert shared == len(base.diff_ids) + 2 + len(below)
    assert len(enhanced.diff_ids) == len(stable.diff_ids) + 1


def test_l0_passes_in_each_image_and_what_needs_a_card_is_unsupported(cuda_images,
                                                                     cpu_project: Path):
    done = stackpin_cli("verify", CUDA_CELL, "--variant", "all", "--levels",
                        "0,1,2,3,4,5,6,7", "--no-devices", cwd=cpu_project)
    assert done.returncode == 0, done.stdout + done.stderr
    for variant in VARIANTS:
        report = json.loads((cpu_project / "build" / "reports" / f"{CUDA_CELL}-{variant}"
                             / "report.json").read_text())
        checks = {c["name"]: c for c in report["checks"]}
        assert report["summary"]["required_failed"] == 0
        for name in ("L0.image_info", "L0.python", "L0.torch_version", "L0.numpy",
                     "L0.pins", "L0.boundary", "L0.imports"):
            assert checks[name]["status"] == "pass", (variant, name, checks[name])
        for name in ("L0.backend", "L0.devices", *(f"L{n}.level" for n in range(1, 8))):
            assert checks[name]["status"] == "skip", (variant, name)
            assert checks[name]["reason"].startswith(UNSUPPORTED), (variant, name)
        # No kernel level ran anything, so none passed anything.
        assert not [n for n, c in checks.items() if n[:2] in {f"L{k}" for k in range(1, 8)}
                    and c["status"] == "pass"]
        modules = checks["L0.imports"]["metrics"]["modules"]
        assert {"torch", "triton", "bitsandbytes", "unsloth"} <= set(modules)
        assert ("flash_attn.cute" in modules) == (variant == "enhanced")
        assert checks["L0.imports"]["metrics"]["unsloth_backend"] == "cpu fallback"
        assert checks["L0.torch_version"]["metrics"]["actual"] == "2.11.0"
        assert report["image"]["variant"] == variant
        assert report["image"]["lock_digest"] == _lock().digest
        assert report["recommendation"]["choice"] == "unsupported"


@pytest.fixture(scope="module", params=VARIANTS)
def host(request: pytest.FixtureRequest, cuda_images,
         cuda_engine: DockerEngine) -> Iterator[tuple[str, testinfra.host.Host]]:
    variant = str(request.param)
    image = str(cuda_images[variant]["image_id"])
    run = RunRequest(image=image, entrypoint=("sleep",), command=("infinity",),
                     network_mode="none")
    with cuda_engine.container(run) as running:
        yield variant, testinfra.get_host(f"docker://{running.name}")


def test_every_installed_distribution_is_the_lock_s_for_the_variant(host):
    variant, box = host
    out = box.check_output(
        "/opt/stackpin/venv/bin/python -c 'import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata[\"Name\"]: d.version for d in m.distributions()}))'")
    installed = {str(canonicalize_name(k)): v for k, v in json.loads(out).items()}
    installed.pop("pip", None)  # the venv's own pip, from Debian's python3-venv
    assert installed == variant_pins(variant)


def test_torch_is_the_cuda_13_build_and_image_json_names_the_variant(host):
    variant, box = host
    out = box.check_output("python -c 'import torch; print(torch.__version__, torch.version.cuda)'")
    assert out.split() == ["2.11.0+cu130", "13.0"]
    info = json.loads(box.file("/opt/stackpin/image.json").content_string)
    assert (info["cell"], info["variant"], info["platform"]) == (CUDA_CELL, variant, "cuda")


def test_no_wheel_pip_cache_apt_list_or_build_leftover(host):
    _variant, box = host
    assert box.check_output(
        "find / -xdev \\( \\( -name '*.whl' -not -path '/usr/share/python-wheels/*' \\) "
        "-o -path /root/.cache \\) -print") == ""
    assert box.check_output("find /var/lib/apt/lists -type f ! -name lock") == ""
    # /tmp holds nothing but the empty folders the BuildKit Dockerfile's first step laid
    # down as its steps' mount targets (render.mount_stubs): no file, nothing else.
    cell = load_cells(sorted((ROOT / "pinning").glob("*.toml")))[CUDA_CELL]
    folders = mount_stub_folders(stub_layer_names(cell, _lock()))
    targets = {f"/{name}" for name in folders if name.startswith("tmp/")}
    assert set(box.check_output("find /tmp -mindepth 1").split()) <= targets
    assert box.check_output("find /tmp -mindepth 1 \\( ! -type d -o ! -empty \\) "
                            "! -path /tmp/context ! -path /tmp/wheelhouse") == ""


def test_the_build_guard_passes_in_the_image_and_refuses_another_torch(host):
    """Run again in the finished image (no bytecode pass): the guard the build ran is
    satisfied by what the image holds, and it is a guard that can fail."""
    _variant, box = host
    guard = ("/opt/stackpin/venv/bin/python /opt/stackpin/guard.py --python cp311 "
             "--numpy '<3' --boundary /opt/stackpin/image.json --torch ")
    assert box.run(guard + "2.11.0").rc == 0
    wrong = box.run(guard + "2.11.0+cu128")
    assert wrong.rc != 0
    assert "cu128" in wrong.stdout + wrong.stderr


def test_labels_name_the_cell_variant_and_lock(cuda_images, cuda_engine: DockerEngine):
    for variant in VARIANTS:
        info = cuda_engine.image_info(str(cuda_images[variant]["image_id"]))
        assert info is not None
        assert info.labels["io.stackpin.cell"] == CUDA_CELL
        assert info.labels["io.stackpin.variant"] == variant
        assert info.labels["io.stackpin.lock-digest"] == _lock().digest
        assert json.loads(info.labels["io.stackpin.cell-json"])["platform"] == "cuda"


def test_images_lists_both_with_their_overhead(cuda_images, cpu_project: Path):
    done = subprocess.run([sys.executable, "-m", "stackpin.cli.main", "images", "--json"],
                          cwd=cpu_project, capture_output=True, text=True, check=True)
    rows = {row["id"]: row for row in json.loads(done.stdout)}
    for variant in VARIANTS:
        row = rows[str(cuda_images[variant]["image_id"])]
        assert (row["cell"], row["variant"]) == (CUDA_CELL, variant)
        assert row["overhead"] is not None and row["overhead"] <= 1.05


# --- Studio served from the CUDA images on this CPU host --------------------------------


def _serve(cpu_project: Path, variant: str, models: Path, state: Path,
           *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(  # in the engine's namespace: its 127.0.0.1 ports are there
        [*netns(ENGINE), sys.executable, "-m", "stackpin.cli.main", "serve", CUDA_CELL, "--variant", variant,
         "--models", str(models), "--state", str(state), "--json", *extra],
        cwd=cpu_project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)


def _inspect(container: str) -> dict[str, object]:
    done = subprocess.run(["docker", "inspect", container], capture_output=True, text=True,
                          check=True)
    return dict(json.loads(done.stdout)[0])


def test_both_variants_serve_studio_on_their_ports_without_devices(cuda_images, cpu_project,
                                                                   tmp_path: Path):
    """stable on 127.0.0.1:18888 with tools off and enhanced on 127.0.0.1:18887 with tools
    on, at once, each answering Studio's health JSON; no card flag reaches the daemon and
    the image is told it runs without one (Studio on unsloth's CPU fallback)."""
    models = tmp_path / "models"
    models.mkdir()
    procs = {v: _serve(cpu_project, v, models, tmp_path / f"state-{v}", "--no-devices")
             for v in VARIANTS}
    try:
        for variant, proc in procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, f"{variant}: serve ended: {proc.stderr.read() if proc.stderr else ''}"
            served = json.loads(line)
            port = {"stable": 18888, "enhanced": 18887}[variant]
            assert (served["port"], served["devices"]) == (port, False)
            health = get_json_in_netns(ENGINE, f"http://127.0.0.1:{port}/api/health")
            assert (health["status"], health["service"]) == ("healthy", "Unsloth UI Backend")
            config = _inspect(str(served["container"]))
            host, env = config["HostConfig"], config["Config"]["Env"]  # type: ignore[index]
            assert not host.get("DeviceRequests") and not host.get("Devices")  # type: ignore[union-attr]
            assert "STACKPIN_NO_DEVICES=1" in env
            assert not any(e.startswith("CUDA_VISIBLE_DEVICES=") for e in env)
            tools = "--enable-tools" if variant == "enhanced" else "--disable-tools"
            assert config["Args"][-1] == tools  # type: ignore[index]
            logs = subprocess.run(["docker", "logs", str(served["container"])],
                                  capture_output=True, text=True, check=True)
            assert "runs on unsloth's CPU fallback" in logs.stdout + logs.stderr
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            proc.wait(timeout=120)
    assert [p.returncode for p in procs.values()] == [130, 130]


def test_serve_with_the_device_flags_on_a_host_without_a_card_fails_and_says_so(
        cuda_images, cpu_project, tmp_path: Path):
    """Without --no-devices the cell's --gpus all reaches the daemon, which has no NVIDIA
    runtime here: serve must fail, never quietly start Studio on the CPU."""
    models = tmp_path / "models"
    models.mkdir()
    proc = _serve(cpu_project, "stable", models, tmp_path / "state", "--port", "18886")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0, out
    assert out == ""
    assert "stackpin:" in err.strip().splitlines()[-1]
    done = subprocess.run(["docker", "ps", "-aq", "--filter",
                           f"label=io.stackpin.state={(tmp_path / 'state').resolve()}"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == []


def test_l8_studio_starts_logs_in_and_chats_in_the_stable_image(cuda_images, cpu_project):
    """L8 where it can run on this host: Studio inside the image, on the CPU fallback the
    run without devices selects, logs in, is forced to change the password, chats once."""
    done = subprocess.run(  # L8 talks to Studio on the engine's loopback
        [*netns(ENGINE), sys.executable, "-m", "stackpin.cli.main", "verify", CUDA_CELL,
         "--variant", "stable", "--levels", "8", "--no-devices"],
        cwd=cpu_project, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads((cpu_project / "build" / "reports" / f"{CUDA_CELL}-stable"
                         / "report.json").read_text())
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert [statuses.get(f"L8.service.{step}") for step in ("start", "login", "chat")] \
        == ["pass"] * 3
