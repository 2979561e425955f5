"""One run profile, two readers: `stackpin serve`'s RunRequest and the bundle's bin/start.sh.

The parity test renders each shipped accelerator cell's profile into a signed bundle the
way `bundle export` does (``siteconf.profile_conf``), runs the real start.sh against the
recording docker shim of test_bundle_scripts, and checks the flags it passed, and those of
serve's plan for the same cell, against the cell's [run] declaration.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_bundle_scripts import _calls, _free_port, _rewrite_with_sums, _run, make_site

from stackpin.bundle import format as bundle_format
from stackpin.bundle import siteconf
from stackpin.engine import RunRequest
from stackpin.engine.docker_api import host_config_kwargs
from stackpin.errors import ConfigurationError
from stackpin.matrix import Cell, RunFlags, cell_to_dict
from stackpin.matrixfile import decode_matrix_lenient, parse_toml
from stackpin.runprofile import with_run_profile
from stackpin.service import plan

ROOT = Path(__file__).resolve().parents[2]
CPU_CELL = "cpu-bookworm-torch2130-py311"
ACCELERATOR_CELLS = ["dtk2404-torch210-py310", "dtk2604-k100-torch290-py310",
                     "dtk2604-bw-torch2100-py310", "rocm64-gfx942-torch280-py312",
                     "cuda130-sm90-torch2110-py311"]


@pytest.fixture
def site(tmp_path, shipped_cells):
    """A signed CPU bundle and the recording docker shim (as in test_bundle_scripts)."""
    return make_site(tmp_path, shipped_cells)


def flags_of(argv: list[str]) -> dict[str, object]:
    """The run-profile part of a docker run argv, in the fields of a RunRequest."""
    found: dict[str, list[str]] = {"devices": [], "group_add": [], "volumes": [],
                                   "cap_add": [], "security_opt": [], "ulimits": [], "env": []}
    single: dict[str, str] = {"shm_size": "", "gpus": "", "ipc_mode": ""}
    names = {"--device": "devices", "--group-add": "group_add", "--volume": "volumes",
             "--cap-add": "cap_add", "--security-opt": "security_opt", "--ulimit": "ulimits",
             "--env": "env", "--shm-size": "shm_size", "--gpus": "gpus", "--ipc": "ipc_mode"}
    words = iter(argv)
    for word in words:
        option, equals, value = word.partition("=")
        if option not in names:
            continue
        value = value if equals else next(words)
        key = names[option]
        if key in single:
            single[key] = value
        else:
            found[key].append(value)
    return {**{k: tuple(v) for k, v in found.items()}, **single}


def request_flags(request: RunRequest) -> dict[str, object]:
    return {"devices": request.devices, "group_add": request.group_add,
            "volumes": request.volumes, "cap_add": request.cap_add,
            "security_opt": request.security_opt, "ulimits": request.ulimits,
            "shm_size": request.shm_size, "gpus": request.gpus, "ipc_mode": request.ipc_mode}


def declared(run: RunFlags) -> dict[str, object]:
    return {"devices": run.devices, "group_add": run.group_add, "volumes": run.volumes,
            "cap_add": run.cap_add, "security_opt": run.security_opt, "ulimits": run.ulimits,
            "shm_size": run.shm_size, "gpus": run.gpus, "ipc_mode": run.ipc}


def install_profile(out: Path, cell: Cell) -> None:
    """bin/profiles/stable.conf as `bundle export` writes it for ``cell`` (re-signed)."""
    (entry,) = json.loads((out / "manifest.json").read_bytes())["images"]
    fields = {k: v for k, v in entry.items() if k in bundle_format.BundleImage.__dataclass_fields__}
    image = bundle_format.BundleImage(**{
        **fields, "tags": tuple(fields["tags"]), "arch": cell.arch,
        "cell": cell.id, "platform": cell.platform, "run": bundle_format.run_flags_json(cell.run)})
    _rewrite_with_sums(out, "bin/profiles/stable.conf", siteconf.profile_conf(image))


def start_argv(site_env: tuple[Path, Path, dict[str, str], Path], *args: str) -> list[str]:
    out, _public, env, log = site_env
    log.write_text("")
    done = _run(out, "start.sh", "stable", *args, env={**env, "STACKPIN_PORT": str(_free_port())})
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = [call for call in _calls(log) if call.startswith("run ")]
    return run.split()  # the shim logs "$*"; no profile value holds a space


def served(cell: Cell, tmp_path: Path, shipped_cells: dict[str, Cell], **options: str) -> RunRequest:
    """serve's request for ``cell`` (given the CPU cell's service: the run profile is the
    subject here, whichever cell declares [service])."""
    with_service = replace(cell, service=shipped_cells[CPU_CELL].service)
    (tmp_path / "models").mkdir(exist_ok=True)
    return plan(with_service, "stable", image="x", state_dir=tmp_path / "state",
                models_dir=tmp_path / "models", **options).request


@pytest.mark.parametrize("cell_id", ACCELERATOR_CELLS)
def test_start_sh_and_serve_pass_the_declared_run_profile(site, tmp_path, shipped_cells,
                                                          cell_id):
    cell = shipped_cells[cell_id]
    install_profile(site[0], cell)
    variable = "CUDA_VISIBLE_DEVICES" if cell.platform == "cuda" else "HIP_VISIBLE_DEVICES"

    site_flags = flags_of(start_argv(site, "--devices", "0,1"))
    request = served(cell, tmp_path, shipped_cells, devices="0,1")

    want = declared(cell.run)
    serve_flags = request_flags(request)
    # start.sh and serve add their own state and models mounts beside the cell's.
    assert [v for v in site_flags["volumes"] if v in cell.run.volumes] == list(cell.run.volumes)
    assert [v for v in request.volumes if v in cell.run.volumes] == list(cell.run.volumes)
    for key in ("devices", "group_add", "cap_add", "security_opt", "ulimits", "shm_size",
                "gpus", "ipc_mode"):
        assert site_flags[key] == want[key], (key, site_flags[key])
        assert serve_flags[key] == want[key], (key, serve_flags[key])
    assert f"{variable}=0,1" in site_flags["env"]
    assert request.environment[variable] == "0,1"


def test_without_devices_both_sides_fall_back_to_the_cells_default(site, tmp_path,
                                                                  shipped_cells):
    k100 = shipped_cells["dtk2604-k100-torch290-py310"]
    for default in ("", "1"):
        cell = replace(k100, run=replace(k100.run, visible_devices=default))
        install_profile(site[0], cell)
        site_env = [e for e in flags_of(start_argv(site))["env"]
                    if e.startswith("HIP_VISIBLE_DEVICES=")]
        serve_env = served(cell, tmp_path, shipped_cells).environment.get("HIP_VISIBLE_DEVICES")
        assert site_env == ([f"HIP_VISIBLE_DEVICES={default}"] if default else [])
        assert serve_env == (default or None)


def test_the_dcu_cells_carry_the_fields_run_settings(shipped_cells):
    # dcu-facts.md: at least 32 GiB of shm, memlock and stack unlimited, the DCU nodes.
    for cell in (c for c in shipped_cells.values() if c.platform == "dtk"):
        assert cell.run.shm_size == "32g", cell.id
        assert cell.run.ulimits == ("memlock=-1:-1", "stack=-1:-1"), cell.id
        assert {"/dev/kfd", "/dev/dri"} <= set(cell.run.devices), cell.id
        assert "/opt/hyhal:/opt/hyhal:ro" in cell.run.volumes, cell.id


@pytest.mark.parametrize(("devices", "why"), [
    ("0;reboot", "is not a card list"), ("", "is not a card list"), ("0,", "is not a card list")])
def test_start_refuses_a_bad_card_list_before_docker_runs(site, shipped_cells, devices, why):
    out, _public, env, log = site
    install_profile(out, shipped_cells["dtk2604-k100-torch290-py310"])
    done = _run(out, "start.sh", "stable", "--devices", devices, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert why in done.stderr
    assert not [call for call in _calls(log) if call.startswith("run ")]


def test_cards_cannot_be_chosen_on_cpu_by_either_side(site, tmp_path, shipped_cells):
    out, _public, env, log = site
    done = _run(out, "start.sh", "stable", "--devices", "0", env=env)
    assert done.returncode == 2
    assert "has no cards to choose" in done.stderr
    assert not [call for call in _calls(log) if call.startswith("run ")]
    with pytest.raises(ConfigurationError, match="has no cards to choose"):
        served(shipped_cells[CPU_CELL], tmp_path, shipped_cells, devices="0")
    assert not (tmp_path / "state").exists()
    with pytest.raises(ConfigurationError, match="is not a card list"):
        with_run_profile(RunRequest(image="x"), shipped_cells["dtk2404-torch210-py310"],
                         devices="0 1")


def test_ulimits_reach_the_daemon_as_soft_and_hard_limits(shipped_cells):
    request = with_run_profile(RunRequest(image="x"), shipped_cells["dtk2604-k100-torch290-py310"])
    limits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host_config_kwargs(request)["ulimits"]}
    assert limits == {"memlock": (-1, -1), "stack": (-1, -1)}
    only_soft = replace(request, ulimits=("nofile=1024",))
    (nofile,) = host_config_kwargs(only_soft)["ulimits"]
    assert (nofile["Soft"], nofile["Hard"]) == (1024, 1024)
    cpu = with_run_profile(RunRequest(image="x"), shipped_cells[CPU_CELL])
    assert "ulimits" not in host_config_kwargs(cpu)


@pytest.mark.parametrize("limit", ["core=-1", "memlock=-1:-1 --privileged", "memlock=lots",
                                   "memlock"])
def test_a_ulimit_outside_the_known_shape_is_a_matrix_problem(limit):
    data = parse_toml(ROOT / "pinning" / "dtk.toml")
    data["cells"]["dtk2404-torch210-py310"]["run"]["ulimits"] = [limit]
    _matrix, problems = decode_matrix_lenient(data)
    assert [str(p) for p in problems if "ulimits" in str(p)], problems


def test_a_ulimit_the_profile_did_not_get_from_stackpin_is_refused_by_start(site):
    out, _public, env, log = site
    rel = "bin/profiles/stable.conf"
    _rewrite_with_sums(out, rel, (out / rel).read_text() + "PROFILE_RUN_ARGS=(--ulimit=core=-1)\n")
    done = _run(out, "start.sh", "stable", env=env)
    assert done.returncode == 7  # the bundle (its signed profile) is refused
    assert "bad --ulimit=core=-1" in done.stderr
    assert not [call for call in _calls(log) if call.startswith("run ")]


def test_a_cell_without_ulimits_keeps_the_form_its_lock_was_digested_from(shipped_cells):
    cpu = shipped_cells[CPU_CELL]
    assert "ulimits" not in cell_to_dict(cpu)["run"]
    dtk = shipped_cells["dtk2404-torch210-py310"]
    assert cell_to_dict(dtk)["run"]["ulimits"] == ["memlock=-1:-1", "stack=-1:-1"]


@pytest.mark.parametrize("cell_id", ACCELERATOR_CELLS)
def test_no_devices_drops_only_the_device_flags_on_both_sides(site, tmp_path, shipped_cells,
                                                               cell_id):
    """A GPU image on a host with no card (CI, a laptop): start.sh --no-devices and serve
    --no-devices pass neither card nodes nor --gpus nor a card choice nor the device host's
    mounts nor memlock, tell the image so, and keep every other declared flag (shm, stack,
    groups)."""
    import sys

    sys.path.insert(0, str(ROOT / "templates"))
    import serve as image_launcher

    from stackpin.runprofile import NO_DEVICES_ENV

    cell = shipped_cells[cell_id]
    install_profile(site[0], cell)
    site_flags = flags_of(start_argv(site, "--no-devices"))
    request = served(cell, tmp_path, shipped_cells, no_devices=True)
    # memlock pins host memory for the cards' DMA: with no card it goes too (runprofile).
    kept_ulimits = tuple(u for u in cell.run.ulimits if not u.startswith("memlock="))
    want = {**declared(cell.run), "devices": (), "gpus": "", "ulimits": kept_ulimits}
    serve_flags = request_flags(request)
    for key in ("devices", "group_add", "cap_add", "security_opt", "ulimits", "shm_size",
                "gpus", "ipc_mode"):
        assert site_flags[key] == want[key], (key, site_flags[key])
        assert serve_flags[key] == want[key], (key, serve_flags[key])
    # The device host's mounts (/opt/hyhal) go on both sides; start.sh's state and models stay.
    assert serve_flags["volumes"] == ()
    assert not set(cell.run.volumes) & set(site_flags["volumes"])
    # One name on the three sides: stackpin, start.sh and the image's Studio launcher.
    assert NO_DEVICES_ENV == image_launcher.NO_DEVICES_ENV
    own = ("STACKPIN_PROFILE=", "HOME=")  # start.sh's own, for every profile
    assert [e for e in site_flags["env"] if not e.startswith(own)] == [f"{NO_DEVICES_ENV}=1"]
    assert request.environment[NO_DEVICES_ENV] == "1"
    assert not any(key.endswith("_VISIBLE_DEVICES") for key in request.environment)


def test_the_image_launcher_allows_the_cpu_fallback_only_without_devices():
    import sys

    sys.path.insert(0, str(ROOT / "templates"))
    import serve as image_launcher

    sys.path.insert(0, str(ROOT / "verify"))
    from stackpin_verify import imports

    # L0.imports judges unsloth on the same switch Studio is started with.
    assert imports._CPU_FALLBACK == {image_launcher.CPU_FALLBACK_ENV: "0"}
    on = image_launcher.environment_for({"STACKPIN_NO_DEVICES": "1", "PATH": "/bin"})
    assert on[image_launcher.CPU_FALLBACK_ENV] == "0"
    # With the device flags (or a stray value), Studio keeps its own default: a GPU image
    # whose card is missing fails to load a model instead of quietly running on the CPU.
    for environ in ({}, {"STACKPIN_NO_DEVICES": "0"}, {"STACKPIN_NO_DEVICES": "yes"}):
        assert image_launcher.CPU_FALLBACK_ENV not in image_launcher.environment_for(environ)


def test_devices_and_no_devices_together_are_refused_by_both_sides(site, tmp_path,
                                                                  shipped_cells):
    cell = shipped_cells["cuda130-sm90-torch2110-py311"]
    install_profile(site[0], cell)
    out, _public, env, log = site
    log.write_text("")
    done = _run(out, "start.sh", "stable", "--devices", "0", "--no-devices",
                env={**env, "STACKPIN_PORT": str(_free_port())})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "contradict" in done.stderr
    assert not [call for call in _calls(log) if call.startswith("run ")]
    with pytest.raises(ConfigurationError, match="contradict"):
        served(cell, tmp_path, shipped_cells, devices="0", no_devices=True)
def test_serve_without_devices_keeps_the_profile_but_no_device_or_device_host_mount(
        tmp_path, shipped_cells):
    cell = shipped_cells["dtk2604-k100-torch290-py310"]
    bare = served(cell, tmp_path, shipped_cells, no_devices=True)
    assert (bare.devices, bare.volumes) == ((), ())
    assert "HIP_VISIBLE_DEVICES" not in bare.environment
    # memlock pins memory for the cards' DMA; a daemon without CAP_SYS_RESOURCE refuses it.
    assert (bare.shm_size, bare.ulimits) == (cell.run.shm_size, ("stack=-1:-1",))
    assert "memlock=-1:-1" in cell.run.ulimits
    with pytest.raises(ConfigurationError, match="contradict"):
        served(cell, tmp_path, shipped_cells, no_devices=True, devices="0")
