"""Rendering: golden Dockerfiles of synthetic cells, exact text of each template fragment,
and what every shipped cell's render must hold.

Goldens come from tests/fixtures/synthetic.toml, never from pinning/: a pin bump in a
shipped matrix changes no golden file.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shlex
import subprocess
import tarfile
from types import SimpleNamespace

import pytest
from tests.conftest import ROOT
from tests.golden_files import assert_golden
from tests.synthetic import synthetic_cells, synthetic_lock

from stackpin.context import read_sources
from stackpin.errors import ConfigurationError
from stackpin.layers import install_layers
from stackpin.lock import read_lock
from stackpin.matrix import Cell
from stackpin.matrixfile import load_cells
from stackpin.render import (
    STUBS_TAR,
    RenderRequest,
    base_reference,
    dockerfile_quote,
    image_labels,
    render,
    render_template,
    venv_replaced,
)
from stackpin.tools import load_installer

TEMPLATES = ROOT / "templates"
INSTALLER = load_installer(ROOT)
SYNTHETIC = synthetic_cells()
CPU_CELL = "synth-cpu"
K100_CELL = "synth-dtk"  # the DTK shape: env.sh, vendor torch, FlashAttention


def _render(cell: Cell, variant: str, *, with_lock: bool = True, builder: str = "classic"):
    return render(
        RenderRequest(
            cell=cell,
            variant=variant,  # type: ignore[arg-type]
            lock=synthetic_lock(cell) if with_lock else None,
            sources=read_sources(TEMPLATES),
            stackpin_version="0.1.0",
            builder=builder,  # type: ignore[arg-type]
            installer=INSTALLER,
        )
    )


@pytest.fixture(scope="module")
def shipped_cells() -> dict[str, Cell]:
    """Here: the synthetic cells (the shipped ones have their own test below)."""
    return SYNTHETIC


@pytest.mark.parametrize(
    ("cell_id", "variant"), [(c.id, v) for c in SYNTHETIC.values() for v in c.variants]
)
def test_golden_dockerfile(cell_id: str, variant: str):
    assert_golden(f"dockerfiles/{cell_id}-{variant}.Dockerfile",
                  _render(SYNTHETIC[cell_id], variant).dockerfile)


@pytest.mark.parametrize(
    ("cell_id", "variant"), [(c.id, v) for c in SYNTHETIC.values() for v in c.variants]
)
def test_golden_buildkit_dockerfile(cell_id: str, variant: str):
    assert_golden(f"dockerfiles/buildkit/{cell_id}-{variant}.Dockerfile",
                  _render(SYNTHETIC[cell_id], variant, builder="buildkit").dockerfile)


def _instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined."""
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if line and not line.startswith(("#", " "))]


def test_buildkit_writes_the_environment_once_with_no_wheel_in_any_layer(shipped_cells):
    text = _render(shipped_cells[K100_CELL], "enhanced", builder="buildkit").dockerfile
    steps = _instructions(text)
    froms = [s for s in steps if s.startswith("FROM ")]
    # The tools stage (clamp, uv) and the one stage the image is: no install stage.
    assert [f.split()[-1] for f in froms] == ["tools", base_reference(shipped_cells[K100_CELL])]
    final = steps[steps.index(froms[-1]):]
    assert not any(s.startswith("COPY") for s in final)  # the build files come by RUN
    installs = [s for s in final if "uv pip install" in s]
    layers = [x.name for x in install_layers(shipped_cells[K100_CELL], "enhanced",
                                             synthetic_lock(shipped_cells[K100_CELL]))]
    assert layers == ["vendor", "stack", "pinned", "attention"]  # no unpinned pure wheel here
    tools = "--mount=type=bind,from=tools,source=/opt/stackpin-tools,target=/opt/stackpin-tools"
    for layer, step in zip(layers, installs, strict=True):
        # Each layer mounts its own wheels, in the order torch/vendor -> compiled stack ->
        # pure-Python stack -> attention, and compiles the bytecode of what it installed.
        mount = f"--mount=type=bind,source=wheels/{layer},target=/tmp/wheelhouse/{layer}"
        assert step.startswith(f"RUN {mount} {tools} t0=$(date +%s%N) && source /opt/dtk/env.sh && ")
        assert "--offline --no-config --no-cache --no-index --no-deps --require-hashes --no-build" in step
        assert f"-r /tmp/wheelhouse/{layer}/requirements.txt" in step
        assert (f"&& /opt/stackpin/venv/bin/python /opt/stackpin-tools/compile.py "
                f"/tmp/wheelhouse/{layer}/requirements.txt") in step
    assert "compile" not in next(s for s in final if "guard.py" in s), "no whole-venv pass"
    guard = next(i for i, s in enumerate(final) if "guard.py" in s)
    assert guard > final.index(installs[-1])  # the guard sees every install
    # Every step of the image ends with the clamp of what it wrote (docs/reproducibility.md).
    runs = [s for s in final if s.startswith("RUN ")]
    assert len(runs) == len(layers) + 2  # the venv, the installs, the guard
    for step in runs:
        assert tools in step
        assert step.endswith('&& python3 /opt/stackpin-tools/clamp.py 1700000000 "$t0"'), step


def test_buildkit_build_settings_reach_every_run_but_not_the_image(shipped_cells):
    text = _render(shipped_cells[CPU_CELL], "stable", builder="buildkit").dockerfile
    steps = _instructions(text)
    args = [s for s in steps if s.startswith("ARG ")]
    assert args == ["ARG PIP_NO_INDEX=1", "ARG PIP_NO_CACHE_DIR=1",
                    "ARG PIP_DISABLE_PIP_VERSION_CHECK=1", "ARG PYTHONDONTWRITEBYTECODE=1",
                    "ARG SOURCE_DATE_EPOCH=1700000000"]
    final = max(i for i, s in enumerate(steps) if s.startswith("FROM "))
    first_run = next(i for i, s in enumerate(steps) if s.startswith("RUN ") and i > final)
    assert final < min(steps.index(a) for a in args)
    assert max(steps.index(a) for a in args) < first_run
    envs = " ".join(s for s in steps if s.startswith("ENV "))
    assert "PIP_" not in envs and "PYTHONDONTWRITEBYTECODE" not in envs


def _shipped() -> list[tuple[Cell, str]]:
    cells = load_cells(sorted((ROOT / "pinning").glob("*.toml")))
    return [(c, v) for c in cells.values() for v in c.variants]


@pytest.mark.parametrize(("cell", "variant"), _shipped(), ids=lambda x: getattr(x, "id", x))
def test_every_shipped_cell_renders_its_own_pins(cell: Cell, variant: str):
    # No golden: what must hold for any pins, checked against the cell's own values.
    rendered = render(RenderRequest(cell=cell, variant=variant,  # type: ignore[arg-type]
                                    lock=None, sources=read_sources(TEMPLATES), stackpin_version="0"))
    text = rendered.dockerfile
    assert text.count(f"FROM {base_reference(cell)}") == 2
    assert f"--python {cell.python} " in text
    assert f"--numpy {shlex.quote(cell.numpy)}" in text
    assert rendered.labels["io.stackpin.cell"] == cell.id
    assert ("wheels/attention/" in text) == (variant == "enhanced" and cell.attention is not None)


# --- each fragment on its own, exact text (hpccm tests its building blocks this way) ---


def _fragment(name: str, **context: object) -> str:
    return render_template(read_sources(TEMPLATES), f"fragments/{name}.j2", context)


def test_fragment_build_env():
    assert _fragment("build-env", cell=SimpleNamespace(source_date_epoch=42)) == (
        "# No index, no cache, no bytecode from imports: the install stage reads the locked\n"
        "# wheelhouse only, and each install step compiles its own layer's bytecode\n"
        "# (deterministically).\n"
        "ENV PIP_NO_INDEX=1 \\\n"
        "    PIP_NO_CACHE_DIR=1 \\\n"
        "    PIP_DISABLE_PIP_VERSION_CHECK=1 \\\n"
        "    PYTHONDONTWRITEBYTECODE=1 \\\n"
        "    SOURCE_DATE_EPOCH=42\n"
    )


def test_fragment_install_layer():
    layer = {"group": "stack", "title": "Layer 2: T.", "why": "W."}
    assert _fragment("install-layer", layer=layer, prefix="source /e.sh && ",
                     installer=None) == (
        "# Layer 2: T.\n"
        "# W.\n"
        "COPY wheels/stack/ /tmp/wheelhouse/stack/\n"
        "RUN source /e.sh && /opt/stackpin/venv/bin/pip install --no-index --no-deps "
        "--require-hashes --no-compile \\\n"
        "        --find-links /tmp/wheelhouse/stack -r /tmp/wheelhouse/stack/requirements.txt "
        "\\\n"
        f"{COMPILE_STACK}"
        "    && rm -rf /tmp/wheelhouse/stack\n"
    )



def test_fragment_install_layer_with_the_pinned_installer():
    layer = {"group": "stack", "title": "Layer 2: T.", "why": "W."}
    assert _fragment("install-layer", layer=layer, prefix="", installer=INSTALLER,
                     uv_dir="/tmp/uv") == (
        "# Layer 2: T.\n"
        "# W.\n"
        "COPY wheels/stack/ /tmp/wheelhouse/stack/\n"
        "RUN /tmp/uv/uv pip install --python /opt/stackpin/venv/bin/python --offline "
        "--no-config --no-cache \\\n"
        "        --no-index --no-deps --require-hashes --no-build \\\n"
        "        --find-links /tmp/wheelhouse/stack -r /tmp/wheelhouse/stack/requirements.txt "
        "\\\n"
        f"{UV_CACHE_STRIP}"
        f"{COMPILE_STACK}"
        "    && rm -rf /tmp/wheelhouse/stack\n"
    )


COMPILE_STACK = ("    && /opt/stackpin/venv/bin/python /tmp/tools/compile.py "
                 "/tmp/wheelhouse/stack/requirements.txt \\\n")


UV_CACHE_STRIP = (
    "    && find /opt/stackpin/venv/lib -path '*.dist-info/uv_cache.json' -exec sh -c "
    "'for f; do sed -i \"/\\/uv_cache\\.json,/d\" \"${f%/uv_cache.json}/RECORD\" && rm \"$f\"; "
    "done' sh {} + \\\n"
)


def test_uv_cache_records_go_with_their_record_lines(tmp_path):
    """uv writes dist-info/uv_cache.json with the install time: the layer must not keep it
    (two builds of one lock gave two image IDs), and RECORD must not name a file that is gone."""
    lib = tmp_path / "lib"
    info = lib / "python3.11" / "site-packages" / "demo-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "uv_cache.json").write_text('{"timestamp":{"secs_since_epoch":1796208788}}')
    (info / "METADATA").write_text("Name: demo\n")
    (info / "RECORD").write_text("demo/__init__.py,sha256=abc,1\n"
                                 "demo-1.0.dist-info/METADATA,sha256=def,12\n"
                                 "demo-1.0.dist-info/uv_cache.json,sha256=ghi,46\n"
                                 "demo-1.0.dist-info/RECORD,,\n")
    command = UV_CACHE_STRIP.replace("    && ", "", 1).rstrip("\\\n").replace(
        "/opt/stackpin/venv/lib", str(lib))
    subprocess.run(["bash", "-euc", command], check=True)
    assert not (info / "uv_cache.json").exists()
    assert (info / "RECORD").read_text() == ("demo/__init__.py,sha256=abc,1\n"
                                             "demo-1.0.dist-info/METADATA,sha256=def,12\n"
                                             "demo-1.0.dist-info/RECORD,,\n")
    assert (info / "METADATA").exists()


def test_the_installer_is_checked_before_it_runs_and_never_reaches_the_image():
    classic = _render(SYNTHETIC[CPU_CELL], "stable").dockerfile
    buildkit = _render(SYNTHETIC[CPU_CELL], "stable", builder="buildkit").dockerfile
    check = (f"echo '{INSTALLER.sha256}  /tmp/tools/{INSTALLER.wheel}' | sha256sum --check "
             "--quiet")
    for text in (classic, buildkit):
        steps = _instructions(text)
        unpack = next(i for i, s in enumerate(steps) if check in s)
        first_install = next(i for i, s in enumerate(steps) if "uv pip install" in s)
        assert unpack < first_install
        assert "pip install" not in " ".join(s for s in steps if "uv pip" not in s)
    # Classic: in the install stage's /tmp, which the final stage never copies.
    final = classic[classic.rindex("\nFROM "):]
    assert "/tmp/uv" not in final and "COPY --from=install /opt/stackpin /opt/stackpin" in final
    # BuildKit: in the tools stage, only ever bind-mounted.
    assert "COPY --from=tools" not in buildkit


def test_fragment_guard_quotes_versions_for_the_shell():
    cell = SimpleNamespace(python="cp399", numpy="<2")
    assert _fragment("guard", cell=cell, prefix="", torch_version="1.0+x y", env_script="",
                     one_stage=False) == (
        "# Guard: the build fails here, not at the site, when pip installed anything but the pins\n"
        "# (pip check inside, less the requirements the cell drops by name in the matrix). Bytecode\n"
        "# is not its job: each install step compiled its own layer's (tools/compile.py).\n"
        "COPY stackpin/ /opt/stackpin/\n"
        "# The vendor boundary by verify's own rule (L0.boundary's): one file, beside the guard.\n"
        "COPY verify/stackpin_verify/boundary.py /opt/stackpin/boundary.py\n"
        "RUN /opt/stackpin/venv/bin/python /opt/stackpin/guard.py \\\n"
        "        --python cp399 --torch '1.0+x y' --numpy '<2' \\\n"
        "        --boundary /opt/stackpin/image.json \\\n"
        "    && rm -rf /root/.cache /tmp/*\n"
    )


def test_fragment_labels_quote_every_value():
    labels = [("a.b", 'say "hi" $HOME'), ("c", "d")]
    assert _fragment("labels", labels=labels) == (
        'LABEL \\\n      a.b="say \\"hi\\" \\$HOME" \\\n      c="d"\n'
    )


def test_fragment_runtime_env():
    text = _fragment("runtime-env", attention="sdpa", runtime_env=[("K", "v w")], env_script="")
    assert text == (
        "# $PATH is the base image's: DTK and hyhal tools stay on it for `docker exec`. The base's\n"
        "# PATH is kept beside it (one ENV: both read the base's value), and verify L0.path checks\n"
        "# that the image's PATH still holds every entry of it.\n"
        "ENV STACKPIN_BASE_PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:"
        "/bin} \\\n"
        "    PATH=/opt/stackpin/venv/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:"
        "/usr/bin:/sbin:/bin} \\\n"
        "    VIRTUAL_ENV=/opt/stackpin/venv \\\n"
        "    PYTHONPATH=/opt/stackpin/verify \\\n"
        "    STACKPIN_ATTENTION=sdpa \\\n"
        '    K="v w"\n'
    )


def test_render_is_byte_identical_across_calls(shipped_cells):
    first = _render(shipped_cells[K100_CELL], "enhanced")
    second = _render(shipped_cells[K100_CELL], "enhanced")
    assert first.files == second.files


def test_dtk_enhanced_holds_no_deps_env_sourcing_guard(shipped_cells):
    text = _render(shipped_cells[K100_CELL], "enhanced").dockerfile
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    assert runs and all(line.startswith("RUN source /opt/dtk/env.sh && ") for line in runs)
    assert text.count("--no-index --no-deps --require-hashes --no-build") == 4
    assert "guard.py" in text and "--torch 1.0.0+das.dtk9901" in text
    assert "--numpy '<2'" in text
    assert "pip check" in text


def test_final_stage_copies_only_the_environment(shipped_cells):
    text = _render(shipped_cells[K100_CELL], "enhanced").dockerfile
    final = text.split("# ---- final stage")[1].split("\n", 1)[1]
    copies = [line for line in final.splitlines() if line.startswith("COPY")]
    assert copies == [
        "COPY --from=install /opt/stackpin /opt/stackpin",
        "COPY verify/ /opt/stackpin/verify/",
        # the shells' hooks for the env script, staged in the install stage
        "COPY --from=install /opt/stackpin/etc/ /etc/",
    ]
    assert [line.split()[0] for line in final.splitlines() if line and not line.startswith(("#", " "))] == [
        "FROM", "COPY", "COPY", "ENV", "COPY", "LABEL", "ENTRYPOINT", "CMD",
    ]


def test_stable_variant_has_no_attention_layer(shipped_cells):
    text = _render(shipped_cells[K100_CELL], "stable").dockerfile
    assert "wheels/attention" not in text
    assert "STACKPIN_ATTENTION=sdpa" in text


def test_enhanced_adds_attention_layer_last(shipped_cells):
    rendered = _render(shipped_cells[K100_CELL], "enhanced")
    text = rendered.dockerfile
    assert text.index("wheels/vendor/") < text.index("wheels/stack/") < text.index("wheels/attention/")
    assert "wheels/attention/requirements.txt" in rendered.files


def test_entrypoint_sources_dtk_env(shipped_cells):
    entry = _render(shipped_cells[K100_CELL], "stable").files["stackpin/entrypoint.sh"]
    assert 'source "$(dirname -- "${BASH_SOURCE[0]}")/env.sh"' in entry and entry.rstrip().endswith('exec "$@"')
    assert "if [ ! -f /opt/dtk/env.sh ]; then" in entry  # refuses to start without it
    cpu_entry = _render(shipped_cells[CPU_CELL], "stable").files["stackpin/entrypoint.sh"]
    assert "source" not in cpu_entry


def test_labels_carry_cell_variant_lock_and_cell_json(shipped_cells):
    cell = shipped_cells[CPU_CELL]
    rendered = _render(cell, "stable")
    lock = synthetic_lock(cell)
    labels = rendered.labels
    assert labels["io.stackpin.cell"] == CPU_CELL
    assert labels["io.stackpin.variant"] == "stable"
    assert labels["io.stackpin.lock-digest"] == lock.digest
    assert json.loads(labels["io.stackpin.cell-json"])["id"] == CPU_CELL
    assert labels["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"


def test_requirements_are_hash_locked_per_layer(shipped_cells):
    cell = shipped_cells[CPU_CELL]
    rendered = _render(cell, "stable")
    vendor = rendered.files["wheels/vendor/requirements.txt"].splitlines()[1:]
    assert vendor == [f"torch==1.0.0+cpu --hash=sha256:{cell.torch.sha256}"]
    stack = [line for name, text in rendered.files.items()
             if name.startswith("wheels/") and name.split("/")[1] in ("stack", "pure", "pinned")
             for line in text.splitlines()[1:]]
    assert any(line.startswith("alpha==1.0.0 --hash=sha256:") for line in stack)
    assert all(" --hash=sha256:" in line for line in stack)


def test_image_json_records_pins(shipped_cells):
    info = json.loads(_render(shipped_cells[CPU_CELL], "stable").files["stackpin/image.json"])
    assert info["torch"] == "1.0.0+cpu"
    assert info["pins"]["numpy"] == "1.0.0"
    assert info["attention"] == "sdpa"
    assert info["bitsandbytes"] == "disabled"


def test_unknown_variant_is_refused(shipped_cells):
    with pytest.raises(ConfigurationError, match="builds stable, not 'enhanced'"):
        _render(shipped_cells[CPU_CELL], "enhanced")


def test_base_reference_pins_digest_and_bootstrap_tag(shipped_cells):
    k100 = shipped_cells[K100_CELL]
    digest = "sha256:" + "a" * 64
    pinned = dataclasses.replace(k100, base=dataclasses.replace(k100.base, digest=digest))
    assert base_reference(pinned) == k100.base.image
    assert image_labels_of(pinned)["org.opencontainers.image.base.digest"] == digest
    assert base_reference(shipped_cells[CPU_CELL]).startswith("stackpin/base-bookworm:")


def image_labels_of(cell):
    return image_labels(
        RenderRequest(cell=cell, variant="stable", lock=None, sources=read_sources(TEMPLATES),
                      stackpin_version="0.1.0")
    )


def test_dockerfile_quote_escapes():
    assert dockerfile_quote('a"b$c\\d') == '"a\\"b\\$c\\\\d"'


def test_final_path_extends_the_base_images_path(shipped_cells):
    # A fixed PATH would drop the DTK and hyhal folders the vendor base puts on it for
    # `docker exec`; Docker expands ${PATH} from the base image's config.
    text = _render(shipped_cells[K100_CELL], "enhanced").dockerfile
    final = text.split("# ---- final stage")[1]
    lines = final.splitlines()
    (env,) = [i for i, ln in enumerate(lines) if ln.startswith("ENV STACKPIN_BASE_PATH=${PATH:-")]
    # The next line of the same ENV: both read the base's PATH (L0.path compares them).
    assert lines[env + 1].startswith("    PATH=/opt/stackpin/venv/bin:${PATH:-")


def test_image_json_carries_the_vendor_boundary_and_arch():
    bw = load_cells([ROOT / "pinning" / "dtk.toml"])["dtk2604-bw-torch2100-py310"]
    stable = json.loads(_render(bw, "stable").files["stackpin/image.json"])
    enhanced = json.loads(_render(bw, "enhanced").files["stackpin/image.json"])
    assert stable["arch"] == ["gfx936"]
    assert stable["provided"]["triton"]["version"] == "3.5.0+das.opt1.dtk2604"
    assert "flash-attn" not in stable["provided"], "stable installs no FlashAttention"
    assert enhanced["provided"]["flash-attn"]["version"] == "2.8.3+das.opt1.dtk2604.torch2100"
    assert stable["excluded"]["bitsandbytes"].startswith("no native build")


def _mount_targets(text: str) -> set[str]:
    steps = _instructions(text)
    final = max(i for i, s in enumerate(steps) if s.startswith("FROM "))
    return {m for s in steps[final:] for m in re.findall(r"--mount=\S*target=(\S+)", s)}


@pytest.mark.parametrize(("cell_id", "variant"), [(CPU_CELL, "stable"), (K100_CELL, "enhanced")])
def test_every_mount_target_is_laid_down_before_the_first_run(cell_id: str, variant: str):
    # A target the engine has to make is stamped with the time of the run (and so is its
    # folder) in Engine 20.10's BuildKit layers: each must be a folder of the stubs tar,
    # with its parents, and the runtime files of /etc beside them.
    rendered = _render(SYNTHETIC[cell_id], variant, builder="buildkit")
    steps = _instructions(rendered.dockerfile)
    final = max(i for i, s in enumerate(steps) if s.startswith("FROM "))
    body = [s for s in steps[final + 1:] if not s.startswith(("SHELL", "ARG"))]
    assert body[0] == f"ADD {STUBS_TAR} /"
    stubs = rendered.files[STUBS_TAR].encode("ascii")
    with tarfile.open(fileobj=io.BytesIO(stubs)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    folders = {name for name, m in members.items() if m.isdir()}
    targets = _mount_targets(rendered.dockerfile)
    assert "/tmp/context/verify" in targets and "/opt/stackpin-tools" in targets
    for target in targets:
        parts = target.strip("/").split("/")
        assert {"/".join(parts[:n]) for n in range(1, len(parts) + 1)} <= folders, target
    assert {"etc/hosts", "etc/resolv.conf", "etc/hostname"} <= set(members)
    assert all(m.mtime == SYNTHETIC[cell_id].source_date_epoch and m.uid == m.gid == 0
               and not m.uname for m in members.values())
    assert members["tmp"].mode == 0o1777 and members["etc"].mode == 0o755
    assert members["etc/hosts"].size > 0  # the step's layer has a size (normalize_record)


def test_the_stubs_tar_is_the_same_bytes_on_every_render():
    one = _render(SYNTHETIC[CPU_CELL], "stable", builder="buildkit").files[STUBS_TAR]
    two = _render(SYNTHETIC[CPU_CELL], "stable", builder="buildkit").files[STUBS_TAR]
    assert one == two and len(one) % 512 == 0
    assert STUBS_TAR not in _render(SYNTHETIC[CPU_CELL], "stable").files  # classic: none


@pytest.mark.parametrize("cell_id", [c.id for c in SYNTHETIC.values()
                                     if {"stable", "enhanced"} <= set(c.variants)
                                     and c.attention is not None])
def test_stable_and_enhanced_share_every_buildkit_step_below_attention(shipped_cells, cell_id):
    # The enhanced build reuses stable's layers only if each step below the attention layer
    # is the same text and the same context files: the stubs tar once named the variant's
    # own wheel folders, so the very first step differed and CI built two whole CUDA images.
    stable, enhanced = (_render(shipped_cells[cell_id], v, builder="buildkit")
                        for v in ("stable", "enhanced"))
    assert stable.files[STUBS_TAR] == enhanced.files[STUBS_TAR]
    with tarfile.open(fileobj=io.BytesIO(stable.files[STUBS_TAR].encode("ascii"))) as tar:
        assert "tmp/wheelhouse/attention" in tar.getnames()
    steps = {v: _instructions(r.dockerfile) for v, r in (("s", stable), ("e", enhanced))}
    cut = next(i for i, step in enumerate(steps["e"]) if "wheels/attention" in step)
    assert steps["s"][:cut] == steps["e"][:cut]


def test_the_venv_step_drops_what_of_ensurepip_s_the_lock_pins():
    # The shipped CPU lock pins setuptools (stack layer): the venv step removes ensurepip's
    # own, so the stack layer deletes nothing below it (a whiteout holds the time of the
    # run on Engine 20.10: two cold builds of the CPU image differed only there).
    cells = load_cells(sorted((ROOT / "pinning").glob("*.toml")))
    cell = cells["cpu-bookworm-torch2130-py311"]
    lock = read_lock(ROOT, cell.id)
    assert lock is not None
    layers = install_layers(cell, "stable", lock)
    assert venv_replaced(layers) == ["setuptools"]
    text = render(RenderRequest(cell=cell, variant="stable", lock=lock,
                                sources=read_sources(TEMPLATES), stackpin_version="0",
                                builder="buildkit", installer=INSTALLER)).dockerfile
    venv = next(s for s in _instructions(text) if "python3 -m venv" in s)
    assert "&& /opt/stackpin/venv/bin/python -m pip uninstall --yes --quiet setuptools &&" in venv
    assert venv_replaced(install_layers(SYNTHETIC[CPU_CELL], "stable",
                                        synthetic_lock(SYNTHETIC[CPU_CELL]))) == []
