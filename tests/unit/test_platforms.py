"""Platforms as data (stackpin.platforms): one module per platform, and no other home.

A platform's facts are its ``PlatformSpec``; code reads the spec, the image reads
image.json's ``platform_facts`` and the site scripts read bundle.conf. So:

- no platform name is spelled outside the platforms package, the matrices and the docs
  (a scan of the product's code; torch's own device words have one home in verify/);
- a throw-away fifth platform is one new module and one matrix file: a copy of the
  checkout with those two files added checks, locks (pip, offline, against placeholders),
  renders and produces the bundle's site configuration for it;
- the shipped locks stay current (the cells' JSON form, hence their digests, unchanged).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stackpin import platforms
from stackpin.context import read_sources
from stackpin.lock import cell_digest, read_lock
from stackpin.matrixfile import load_cells
from stackpin.render import RenderRequest, image_info
from stackpin.resolve import placeholder_wheel

ROOT = Path(__file__).resolve().parents[2]

# The product's code: where a platform name would be a rule the spec does not hold.
SCANNED = ("src/stackpin", "verify/stackpin_verify", "bundle", "templates")
HOME = ("src/stackpin/platforms/",)
# torch's own words (device types, backends, collectives): their one home in verify/.
TORCH_WORDS = ("verify/stackpin_verify/torchnames.py",)
# Spellings that are not platform names, each with why.
NOT_PLATFORMS = (
    # cgroup v1's CPU controller folder (/sys/fs/cgroup/cpu/cpu.cfs_quota_us).
    ("verify/stackpin_verify/environment.py", 'root / "cpu" / "cpu.cfs_'),
    # torch.version's attribute: the CUDA toolkit a build was made with, and its report key.
    ("verify/stackpin_verify/", 'getattr(torch.version, "cuda"'),
    ("verify/stackpin_verify/environment.py", 'found["cuda"] = str(torch.version.cuda)'),
    # The backends a torch build reports (torchnames.BACKEND_*; held equal below).
    ("verify/stackpin_verify/report.schema.json", '"backend": {"enum": ["cpu", "cuda", "rocm"]}'),
)


def _patterns(names: tuple[str, ...], *, bash: bool) -> list[re.Pattern[str]]:
    words = "|".join(map(re.escape, names))
    quoted = re.compile(rf"""(["'])(?:{words})\1""")  # Python, JSON, jinja and bash alike
    if not bash:
        return [quoted]
    return [
        quoted,
        # a case pattern: `dtk|rocm)`, `cpu)`
        re.compile(rf"(?:^|[\s(|])(?:{words})\s*(?:\||\))"),
        # a test: [ "$p" = dtk ], [ "$PROFILE_PLATFORM" != cpu ], [[ $p == cuda ]]
        re.compile(rf"""\s(?:!=|==|=)\s*["']?(?:{words})["']?(?=\s|\]|;|$)"""),
    ]


def platform_literals(root: Path, names: tuple[str, ...]) -> Iterator[str]:
    """``path:line: text`` for every platform name spelled outside its homes."""
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if (not path.is_file() or "__pycache__" in rel or rel.startswith(HOME)
                    or rel in TORCH_WORDS or path.suffix not in (".py", ".sh", ".j2", ".json")):
                continue
            patterns = _patterns(names, bash=path.name.endswith((".sh", ".sh.j2")))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if line.lstrip().startswith("#") or any(
                        rel.startswith(where) and text in line for where, text in NOT_PLATFORMS):
                    continue  # a comment says what it likes; a rule is code
                if any(p.search(line) for p in patterns):
                    yield f"{rel}:{number}: {line.strip()}"


def test_platform_names_live_only_in_the_platforms_package():
    assert list(platform_literals(ROOT, platforms.names())) == []


@pytest.mark.parametrize("line", [
    'if cell.platform == "dtk":',
    "PLATFORM_NAMES = {'rocm': 'ROCm'}",
    '    accelerator = platform in ("cuda", "rocm")',
    '        "platform": {"enum": ["cpu", "cuda"]},',
    "        dtk|rocm) card_released ;;",
    '[ "$PROFILE_PLATFORM" != cpu ] && echo card',
    "    cuda) say PASS runtime ;;",
])
def test_the_scan_finds_a_platform_name_wherever_it_slips_back(tmp_path, line):
    name = "bundle/bin/slipped.sh" if (")" in line and "(" not in line) or "[" in line else (
        "src/stackpin/slipped.py")
    (tmp_path / name).parent.mkdir(parents=True)
    (tmp_path / name).write_text(f"{line}\n", encoding="utf-8")
    assert list(platform_literals(tmp_path, platforms.names())) == [f"{name}:1: {line.strip()}"]


@pytest.mark.parametrize("line", [
    'DEFAULT_CELL = "cpu-bookworm-torch2130-py311"',
    "# arch (sm_90, gfx928, cpu) in a comment",
    'say INFO "stop: no card to release on this cpu host"',
])
def test_the_scan_leaves_words_that_only_contain_a_name(tmp_path, line):
    for name in ("src/stackpin/words.py", "bundle/bin/words.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"{line}\n", encoding="utf-8")
    assert list(platform_literals(tmp_path, platforms.names())) == []


def test_the_report_schema_knows_the_backends_torch_reports():
    import verify_helpers  # noqa: F401 - puts verify/ on sys.path

    from stackpin_verify import torchnames

    schema = json.loads((ROOT / "verify/stackpin_verify/report.schema.json").read_text())
    reported = {torchnames.BACKEND_CPU, torchnames.BACKEND_CUDA, torchnames.BACKEND_HIP}
    assert set(schema["properties"]["backend"]["enum"]) == reported
    assert {spec.backend for spec in platforms.specs()} <= reported


def test_every_platform_module_declares_a_sound_spec():
    names = platforms.names()
    assert sorted(names) == sorted(p.stem for p in (ROOT / "src/stackpin/platforms").glob("*.py")
                                   if p.stem not in ("__init__", "spec"))
    for spec in platforms.specs():
        assert re.fullmatch(r"[a-z][a-z0-9]*", spec.name)  # labels, bundle.conf, file names
        assert spec.accelerator == bool(spec.device_hint), spec.name
        assert bool(spec.release_node) <= spec.one_profile_per_card, spec.name
    ranks = [s.label.rank for s in platforms.specs()]
    assert len(set(ranks)) == len(ranks), "a label's vendor must be decidable"


def test_shipped_locks_are_current_for_their_cells():
    # The platforms moved out of the cells' code, not out of their data: every shipped
    # cell's canonical JSON, hence its lock's cell digest, is what the lock says.
    cells = load_cells(sorted((ROOT / "pinning").glob("*.toml")))
    assert len(cells) >= 6
    for cell_id, cell in cells.items():
        lock = read_lock(ROOT, cell_id)
        assert lock is not None and lock.cell_digest == cell_digest(cell), cell_id


def test_shipped_cells_start_from_their_platforms_run_defaults():
    for cell in load_cells(sorted((ROOT / "pinning").glob("*.toml"))).values():
        defaults, run = cell.spec.run_defaults, cell.run
        for key in ("devices", "group_add", "volumes", "ulimits"):
            assert set(getattr(defaults, key)) <= set(getattr(run, key)), (cell.id, key)
        for key in ("shm_size", "gpus"):
            assert getattr(run, key) == getattr(defaults, key), (cell.id, key)


def test_the_image_json_carries_its_platforms_facts(shipped_cells):
    for cell in shipped_cells.values():
        info = image_info(RenderRequest(cell=cell, variant=cell.variants[0], lock=None,
                                        sources=read_sources(ROOT / "templates"),
                                        stackpin_version="0"))
        assert info["platform_facts"] == cell.spec.image_facts(), cell.id
        assert info["platform_facts"]["backend"] == cell.spec.backend


def test_the_gpu_runs_image_json_files_carry_the_cuda_facts():
    # scripts/gpu's hand-written image.json files stand in for a built image's.
    for path in sorted((ROOT / "scripts" / "gpu").glob("image-*.json")):
        info = json.loads(path.read_text(encoding="utf-8"))
        assert info["platform_facts"] == platforms.get(info["platform"]).image_facts(), path


# --- a fifth platform: one module, one matrix file, nothing else --------------------------

XPU_SPEC = '''"""Intel GPUs with oneAPI (XPU): the throw-away fifth platform of test_platforms.py."""

from __future__ import annotations

from stackpin.platforms.spec import (
    PlatformSpec,
    Probe,
    RunDefaults,
    TokenPattern,
    TorchRule,
    WheelLabel,
)

SPEC = PlatformSpec(
    name="xpu",
    title="XPU",
    description="Intel GPUs with oneAPI",
    version_example="2025.1",
    label=WheelLabel(tokens=(TokenPattern(kind="xpu", pattern=r"xpu(?P<v>)(?![0-9a-z])"),),
                     rank=4),
    torch=TorchRule(expected="an XPU torch (+xpu)", fix="pin torch from the PyTorch XPU index",
                    marks=True, vendors=("",)),
    visibility_env="ZE_AFFINITY_MASK",
    device_hint="/dev/dri",
    run_defaults=RunDefaults(devices=("/dev/dri",), group_add=("render",)),
    backend="xpu",
    collective="xccl",
    probes=(Probe(kind="node", target="/dev/dri", passed="device: /dev/dri",
                  failed="device: /dev/dri is missing (driver not loaded?)"),),
    one_profile_per_card=True,
)
'''

XPU_CELL = "xpu2025-torch280-py311"
XPU_MATRIX = f'''schema_version = 1
description = "The throw-away fifth platform of tests/unit/test_platforms.py"

[cells.{XPU_CELL}]
platform = "xpu"
platform_version = "2025.1"
python = "cp311"
glibc = "2.36"
numpy = "<3"
source_date_epoch = 1735689600

[cells.{XPU_CELL}.base.bootstrap]
suite = "bookworm"
mirror = "http://deb.debian.org/debian"
packages = ["python3", "python3-venv"]

[cells.{XPU_CELL}.torch]
filename = "torch-2.8.0+xpu-cp311-cp311-manylinux_2_28_x86_64.whl"
sha256 = "{"ab" * 32}"

[cells.{XPU_CELL}.provided.torch]
version = "2.8.0+xpu"

[cells.{XPU_CELL}.stack]
xpu-demo-runtime = "1.0"

[cells.{XPU_CELL}.run]
devices = ["/dev/dri"]
group_add = ["render"]
'''

SITE_CONF = f"""
from stackpin.bundle import siteconf
from stackpin.bundle.format import BundleImage, StreamStats
from stackpin.declared import plain
from pathlib import Path
from stackpin.target import Layout, load_cell
cell = load_cell(Layout(Path('.')), '{XPU_CELL}')
image = BundleImage(cell=cell.id, variant='stable', profile='stable', port=18888,
                    platform=cell.platform, cpu_arch=cell.cpu_arch, arch=cell.arch,
                    id='sha256:' + '0' * 64, tags=('stackpin/x:stable',), labels={{}},
                    run=plain(cell.run), size=1)
print(siteconf.bundle_conf([image], StreamStats(tar_bytes=1, bytes=1, sha256='0' * 64)))
print('---')
print(siteconf.profile_conf(image))
"""


def _copy_checkout(to: Path) -> set[str]:
    """The checkout's code and data (not its tests or outputs); every file's path."""
    for folder in ("src/stackpin", "templates", "bundle", "verify/stackpin_verify", "pinning"):
        shutil.copytree(ROOT / folder, to / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return {p.relative_to(to).as_posix() for p in to.rglob("*") if p.is_file()}


def _stackpin(project: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackpin.cli.main", *args], cwd=project,
                          env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_a_fifth_platform_is_one_module_and_one_matrix(tmp_path):
    project = tmp_path / "checkout"
    before = _copy_checkout(project)
    (project / "src/stackpin/platforms/xpu.py").write_text(XPU_SPEC, encoding="utf-8")
    (project / "pinning/xpu.toml").write_text(XPU_MATRIX, encoding="utf-8")
    # The index is this folder alone: the stack's one wheel, metadata only (pip offline).
    links = tmp_path / "index"
    placeholder_wheel(links, "xpu-demo-runtime", "1.0", ())
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(links), "STACKPIN_CACHE_DIR": str(tmp_path / "cache")}

    checked = _stackpin(project, "matrix", "check", "pinning/xpu.toml", "--json", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert [v for v in report["violations"] if v["severity"] == "error"] == []
    # The label grammar knows +xpu from the spec alone: no unknown token, no foreign build.
    assert not any("unknown token" in v["found"] for v in report["violations"])

    locked = _stackpin(project, "lock", XPU_CELL, "--json", env=env)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    lock = (project / "pinning" / "locks" / f"{XPU_CELL}.lock").read_text(encoding="utf-8")
    assert "xpu-demo-runtime" in lock and "2.8.0+xpu" in lock

    out = tmp_path / "rendered"
    rendered = _stackpin(project, "render", XPU_CELL, "-o", str(out), env=env)
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    info = json.loads((out / "stackpin" / "image.json").read_text(encoding="utf-8"))
    assert info["platform"] == "xpu"
    assert info["platform_facts"]["backend"] == "xpu"
    assert info["platform_facts"]["collective"] == "xccl"
    assert 'io.stackpin.platform="xpu"' in (out / "Dockerfile").read_text(encoding="utf-8")

    conf = subprocess.run([sys.executable, "-c", SITE_CONF], cwd=project, env=env,
                          capture_output=True, text=True, check=True).stdout
    assert "BUNDLE_PLATFORMS=(xpu)" in conf
    assert "BUNDLE_PROBE_KINDS=(node)" in conf and "BUNDLE_PROBE_TARGETS=(/dev/dri)" in conf
    assert "PROFILE_VISIBILITY_ENV=ZE_AFFINITY_MASK" in conf
    assert "PROFILE_ONE_PER_CARD=1" in conf and "PROFILE_RELEASE_NODE=''" in conf
    assert "--device=/dev/dri" in conf
    # The copy's site scripts take the profile as it is: its run flags are ones they run.
    (tmp_path / "stable.conf").write_text(conf.split("\n---\n")[1], encoding="utf-8")
    subprocess.run(["bash", "-euc", f'. {project}/bundle/bin/lib.sh; . {tmp_path}/stable.conf; '
                    'check_run_args stable "${PROFILE_RUN_ARGS[@]}"'], check=True)

    # Nothing but the two new files (and the lock the verb wrote) was needed or touched,
    # and the new name is spelled only in its module.
    after = {p.relative_to(project).as_posix() for p in project.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    assert after - before == {"src/stackpin/platforms/xpu.py", "pinning/xpu.toml",
                              f"pinning/locks/{XPU_CELL}.lock"}
    for rel in before:
        assert (project / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    assert list(platform_literals(project, ("xpu",))) == []
