"""Faults in real images (issue 13 item 6): each image is the CPU default image plus one
layer that carries a fault the field met, and the build guard or the in-image suite must
fail by name.

Every fault image is one small layer on the cached CPU image (built once per session by the
``cpu_image`` fixture), built with the network off, tagged uniquely and removed afterwards.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackpin.engine import BuildRequest, RunRequest
from stackpin.engine.docker_api import DockerEngine

pytestmark = pytest.mark.docker

VENV = "/opt/stackpin/venv"
SITE = f"{VENV}/lib/python3.11/site-packages"
PY = f"{VENV}/bin/python"
# As the build runs it: the boundary of image.json, and pip check less its dropped edges.
GUARD = (f"{PY} /opt/stackpin/guard.py --python cp311 --torch 2.13.0+cpu --numpy '<2' "
         "--boundary /opt/stackpin/image.json")

# name -> RUN line that injects the fault (files from the context sit in /ctx).
FAULTS = {
    # numpy 2 in a numpy<2 cell: the wheel pip would pick today, installed over 1.26.4.
    "numpy2": f"{VENV}/bin/pip install -q --no-index --no-deps /ctx/numpy-*.whl",
    # A torch whose local label differs from the pin: a CUDA build's label on the CPU pin.
    # The image's .pyc files are unchecked-hash (reproducible builds), so drop the stale one.
    "torch_label": (
        f"sed -i 's/+cpu/+cu121/' {SITE}/torch/version.py"
        f" && rm {SITE}/torch/__pycache__/version.cpython-311.pyc"
    ),
    # `pip install` without --no-deps: a package needing another torch replaces the pinned one.
    "torch_replaced": f"{VENV}/bin/pip install -q --no-index --find-links /ctx needs-torch",
    # The image declares a DTK env script that is not there.
    "env_script": (
        f"{PY} -c \"import json,pathlib; p=pathlib.Path('/opt/stackpin/image.json'); "
        "d=json.loads(p.read_text()); d['env_script']='/opt/dtk/env.sh'; "
        'p.write_text(json.dumps(d))"'
    ),
    # A truncated extension module (an interrupted copy, a full disk).
    "truncated_so": f"truncate -s 4096 {SITE}/numpy/core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so",
    # A requirement nobody dropped goes missing (torch needs filelock): an interrupted or
    # hand-edited install that pip check, inside the guard, must name.
    "missing_requirement": f"{VENV}/bin/pip uninstall -q -y filelock",
    # bitsandbytes present while the image declares it disabled.
    "bitsandbytes": f"{VENV}/bin/pip install -q --no-index --no-deps /ctx/bitsandbytes-*.whl",
}


def _wheel(path: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel (enough for pip to install, replace and record it)."""
    dist = f"{name.replace('-', '_')}-{version}"
    wheel = path / f"{dist}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {req}" for req in requires]
    files = {
        f"{name.replace('-', '_')}/__init__.py": f'__version__ = "{version}"\n',
        f"{dist}.dist-info/METADATA": "\n".join(meta) + "\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: stackpin-test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        archive.writestr(f"{dist}.dist-info/RECORD", record)
    return wheel


def _context(root: Path, base: str, fault: str, numpy_wheel: Path) -> Path:
    ctx = root / fault
    ctx.mkdir()
    if fault == "numpy2":
        (ctx / numpy_wheel.name).write_bytes(numpy_wheel.read_bytes())
    if fault == "torch_replaced":
        # What PyPI would hand pip: a torch release without the +cpu label.
        _wheel(ctx, "torch", "2.13.1")
        _wheel(ctx, "needs-torch", "1.0", requires=("torch==2.13.1",))
    if fault == "bitsandbytes":
        _wheel(ctx, "bitsandbytes", "0.45.0")
    (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY . /ctx/\nRUN {FAULTS[fault]}\n")
    return ctx


@pytest.fixture(scope="session")
def numpy2_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real numpy 2.2.6 wheel for the image's CPython 3.11, from the package index."""
    folder = tmp_path_factory.mktemp("numpy2")
    command = [
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.11", "--implementation", "cp",
        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
        "-d", str(folder), "numpy==2.2.6",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    [wheel] = folder.glob("numpy-2.2.6-*.whl")
    return wheel


class FaultImages:
    """Builds each fault image the first time a test asks for it (one small layer on the
    cached CPU image), so a single test builds only its own; all are removed at the end."""

    def __init__(self, engine: DockerEngine, base: str, root: Path, numpy_wheel: Path) -> None:
        self.engine, self.base, self.root, self.numpy_wheel = engine, base, root, numpy_wheel
        self.token = secrets.token_hex(4)
        self.built: dict[str, str] = {}

    def __getitem__(self, fault: str) -> str:
        if fault not in self.built:
            tag = f"stackpin-test-fault/{fault.replace('_', '-')}:{self.token}"
            request = BuildRequest(
                context_dir=_context(self.root, self.base, fault, self.numpy_wheel),
                tags=(tag,),
                network_mode="none",
                log_path=self.root / f"{fault}.log",
            )
            self.built[fault] = self.engine.build(request).image_id
        return self.built[fault]


# Module scope: a fault image is a child of the CPU image, which no later module could remove
# while one is left (tests/integration/leftovers.py).
@pytest.fixture(scope="module")
def fault_images(
    cpu_image: dict[str, object],
    docker_engine: DockerEngine,
    numpy2_wheel: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FaultImages]:
    images = FaultImages(
        docker_engine, str(cpu_image["image_id"]), tmp_path_factory.mktemp("faults"), numpy2_wheel
    )
    try:
        yield images
    finally:
        for image_id in images.built.values():
            docker_engine.remove_image(image_id, force=True)


def _run(engine: DockerEngine, image: str, command: str) -> tuple[int, str, str]:
    request = RunRequest(
        image=image, entrypoint=("sh", "-c"), command=(command,), network_mode="none"
    )
    result = engine.run_to_completion(request, timeout_s=600)
    return result.exit_code, result.stdout, result.logs


def _suite(engine: DockerEngine, image: str, levels: str) -> tuple[int, dict[str, dict]]:
    code, stdout, logs = _run(
        engine, image, f"{PY} -m stackpin_verify --levels {levels} --out-dir /tmp/r --json"
    )
    assert stdout.lstrip().startswith("{"), logs[-2000:]
    checks = {c["name"]: c for c in json.loads(stdout)["checks"]}
    return code, checks


def test_unfaulted_image_passes_guard_and_level_0(cpu_image, docker_engine):
    code, _, logs = _run(docker_engine, str(cpu_image["image_id"]), GUARD)
    assert code == 0, logs
    code, checks = _suite(docker_engine, str(cpu_image["image_id"]), "0")
    assert code == 0
    assert all(c["status"] != "fail" for c in checks.values())


def test_numpy2_fails_the_guard_and_l0_numpy(fault_images, docker_engine):
    code, _, logs = _run(docker_engine, fault_images["numpy2"], GUARD)
    assert code == 1
    assert "numpy" in logs and "2.2.6" in logs
    code, checks = _suite(docker_engine, fault_images["numpy2"], "0")
    assert code == 1
    assert checks["L0.numpy"]["status"] == "fail"
    assert "numpy 2.2.6 violates the image constraint numpy<2" in checks["L0.numpy"]["reason"]


def test_a_missing_requirement_that_is_not_dropped_fails_the_guard(fault_images, docker_engine):
    code, _, logs = _run(docker_engine, fault_images["missing_requirement"], GUARD)
    assert code == 1
    assert "pip check: torch 2.13.0+cpu requires filelock, which is not installed." in logs
    # The cell's dropped edges (unsloth -> triton, ...) are not reported by the same run.
    assert "requires triton" not in logs


def test_torch_label_differing_from_the_pin_fails_l0_torch_version(fault_images, docker_engine):
    code, checks = _suite(docker_engine, fault_images["torch_label"], "0")
    assert code == 1
    assert checks["L0.torch_version"]["status"] == "fail"
    assert "local label 'cu121' vs pinned 'cpu'" in checks["L0.torch_version"]["reason"]


def test_torch_replaced_by_pip_fails_the_guard(fault_images, docker_engine):
    code, _, logs = _run(docker_engine, fault_images["torch_replaced"], GUARD)
    assert code == 1
    assert "torch is 2.13.1, the cell pins 2.13.0+cpu (a wheel was swapped)" in logs


def test_missing_env_script_fails_l0_dtk_env(fault_images, docker_engine):
    code, checks = _suite(docker_engine, fault_images["env_script"], "0")
    assert code == 1
    assert checks["L0.dtk_env"]["status"] == "fail"
    assert checks["L0.dtk_env"]["reason"] == "DTK env script /opt/dtk/env.sh does not exist"


def test_truncated_extension_fails_l0_import(fault_images, docker_engine):
    """Truncated to 4 KiB, numpy's extension kills `import torch` with SIGBUS: the suite's
    preflight reports it as L0.import instead of dying without a report."""
    code, checks = _suite(docker_engine, fault_images["truncated_so"], "0")
    assert code == 1
    assert list(checks) == ["L0.import"]
    assert "was killed by SIGBUS" in checks["L0.import"]["reason"]


def test_bitsandbytes_present_while_disabled_fails_l4(fault_images, docker_engine):
    code, checks = _suite(docker_engine, fault_images["bitsandbytes"], "4")
    assert code == 1
    assert checks["L4.bitsandbytes"]["status"] == "fail"
    assert "bitsandbytes is installed although the image declares it disabled" in (
        checks["L4.bitsandbytes"]["reason"]
    )
