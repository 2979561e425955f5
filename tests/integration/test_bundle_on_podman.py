"""The CPU bundle at a Podman site (issue 25): preflight, load, verify, start, stop.

RHEL-family sites run Podman, not Docker. The operator's bash scripts alone, with
STACKPIN_ENGINE=podman and Debian's podman 4.3 (rootful), must: pass preflight (Podman's
version and graph root, not Docker's fields), load the signed bundle (`podman load` of
the same stream; the image is named by the signed config digest), run the verification
suite in it (L0-L8, Studio's login and chat), start the stable profile (healthy: Podman
runs the image's HEALTHCHECK when start.sh asks, with or without systemd timers; Studio's
health JSON on 127.0.0.1 of the site's network) and stop it (no container left).

The site runs in a network namespace of its own (stackpin-podman, as the Docker 28
engines do), so Podman's bridge and port forwarding never touch the host's network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.integration.loopback import free_port, get_json_in_netns, netns
from tests.tools import missing, need_tool

pytestmark = pytest.mark.docker

ENGINE = "podman"  # its network namespace: stackpin-podman (loopback.netns)
NETNS = f"stackpin-{ENGINE}"
CONTAINER = "stackpin_site_stable"


def _podman(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=900,
                          env=env)


def _rlimits_conf(folder: Path) -> Path:
    """A containers.conf whose default rlimits this host lets a container have.

    Rootful Podman raises nofile and nproc to 1048576 and more by default; a host (or a
    sandbox) whose hard limits are lower refuses every container ("error setting rlimit").
    A site with stock limits needs none of this; the site scripts pass no rlimits."""
    nofile = int(subprocess.run(["bash", "-c", "ulimit -Hn"], capture_output=True, text=True,
                                check=True).stdout)
    conf = folder / "containers.conf"
    for nproc in (int(subprocess.run(["bash", "-c", "ulimit -Hu"], capture_output=True,
                                     text=True, check=True).stdout), 32768, 4096):
        conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", '
                        f'"nproc={nproc}:{nproc}"]\n')
        probe = subprocess.run(["podman", "run", "--rm", "--network", "none",
                                "stackpin-podman-probe", "true"], capture_output=True,
                               env={**os.environ, "CONTAINERS_CONF": str(conf)}, check=False)
        if probe.returncode == 0:
            return conf
    return conf


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory,
               signed_cpu_bundle: tuple[Path, Path]) -> Iterator[dict[str, str]]:
    need_tool("podman")
    need_tool("nsenter")
    if os.geteuid() != 0:
        missing("the rootful Podman site needs root (network namespace, rootful storage)")
    if not Path(f"/run/netns/{NETNS}").exists():
        subprocess.run(["ip", "netns", "add", NETNS], check=True)
    subprocess.run([*netns(ENGINE), "ip", "link", "set", "lo", "up"], check=True)
    # A three-file image (true and the libc it needs) to probe the rlimits with: the CPU
    # base would do, but costs a load.
    folder = tmp_path_factory.mktemp("podman")
    probe = subprocess.run(
        "tar -chf - /usr/bin/true /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/libc.so.6"
        " 2>/dev/null | podman import --quiet - stackpin-podman-probe",
        shell=True, capture_output=True, text=True, check=False)
    assert probe.returncode == 0, probe.stderr
    conf = _rlimits_conf(folder)
    _bundle, pubkey = signed_cpu_bundle
    env = {**os.environ, "STACKPIN_ENGINE": "podman", "CONTAINERS_CONF": str(conf),
           "STACKPIN_PUBKEY": str(pubkey)}
    env.pop("DOCKER_HOST", None)
    yield env
    _podman("rmi", "--force", "stackpin-podman-probe", env=env)


def _script(bundle: Path, name: str, *args: str, env: dict[str, str],
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*netns(ENGINE), "bash", str(bundle / "bin" / name), *args],
                          capture_output=True, text=True, timeout=1800, env=env)


def test_the_cpu_bundle_runs_under_podman(podman_env: dict[str, str],
                                          signed_cpu_bundle: tuple[Path, Path],
                                          tiny_models: Path, tmp_path: Path) -> None:
    env = podman_env
    good, _pubkey = signed_cpu_bundle
    bundle = tmp_path / "site"
    shutil.copytree(good, bundle, copy_function=os.link)
    (image,) = json.loads((bundle / "manifest.json").read_bytes())["images"]
    config_digest = image["config_digest"]
    _podman("rm", "--force", CONTAINER, env=env)
    _podman("rmi", "--force", config_digest, env=env)
    try:
        done = _script(bundle, "preflight.sh", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "PASS  podman: engine 4." in done.stdout
        assert "/var/lib/containers/storage" in done.stdout  # Podman's graph root, not Docker's

        done = _script(bundle, "load.sh", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        inspected = _podman("image", "inspect", "--format", "{{.Id}}", config_digest, env=env)
        assert inspected.stdout.strip() == config_digest.removeprefix("sha256:")
        tags = _podman("image", "inspect", "--format", "{{json .RepoTags}}", config_digest,
                       env=env)
        assert f"localhost/{image['tags'][0]}" in json.loads(tags.stdout)

        # L0 (imports, the environment) and L8 (Studio started, logged into, chatted with)
        # are where an engine can differ; L1-L7 are the same computation on any engine,
        # ~15 of this test's ~25 minutes, and run under Docker in test_bundle_on_engines
        # (docs/benchmarks.md has a full L0-L8 run under Podman).
        done = _script(bundle, "verify.sh", "stable", "--", "--levels", "0,8", env=env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        report = json.loads((tmp_path / "site.reports" / "stable" / "report.json").read_text())
        assert report["summary"]["required_failed"] == 0
        statuses = {c["name"]: c["status"] for c in report["checks"]}
        assert [statuses.get(f"L8.service.{step}") for step in ("start", "login", "chat")] \
            == ["pass"] * 3

        port = free_port()
        done = _script(bundle, "start.sh", "stable",
                       env={**env, "STACKPIN_PORT": str(port),
                            "STACKPIN_MODELS_DIR": str(tiny_models)})
        assert done.returncode == 0, done.stdout + done.stderr
        state = json.loads(_podman("container", "inspect", CONTAINER, env=env).stdout)[0]
        assert state["State"]["Health"]["Status"] == "healthy"
        health = get_json_in_netns(ENGINE, f"http://127.0.0.1:{port}/api/health")
        assert health["status"] == "healthy", health
        again = _script(bundle, "start.sh", "stable", env={**env, "STACKPIN_PORT": str(port),
                                                           "STACKPIN_MODELS_DIR": str(tiny_models)})
        assert again.returncode == 8 and "already running" in again.stderr

        done = _script(bundle, "stop.sh", "stable", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        left = _podman("ps", "--all", "--quiet", "--filter", f"name=^{CONTAINER}$", env=env)
        assert left.stdout.strip() == ""
    finally:
        _podman("rm", "--force", CONTAINER, env=env)
        _podman("rmi", "--force", config_digest, env=env)  # 2 GB: give the disk back
