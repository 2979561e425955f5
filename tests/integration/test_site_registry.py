"""Sites beyond one machine (issue 25), on real parts: a registry, a second engine, deltas.

- The site registry is Debian's docker-registry (distribution 2.8) started by the bundle's
  own bin/registry.sh inside the network namespace of the Docker 28 classic engine
  (scripts/setup-engines.sh): that namespace's loopback is where the engine pulls from, and
  the push runs there too, so registry, pusher and node meet on 127.0.0.1 as the site
  scripts' loopback default has it.
- bin/push.sh seeds it through a slow, counting proxy (throttle.py); the test kills the
  push once the registry holds a layer and another upload is under way, then pushes again
  and counts what the second push sent: only what the registry did not hold.
- bin/pull.sh on the node (the Docker 28 engine) pulls by the signed digests and checks
  them; a byte flipped in the registry's copy of a layer makes the pull fail.
- A delta bundle (export --against the site's bin/inventory.sh) loads on both Docker 28
  stores where the previous image is present, is refused (exit 7, one line, nothing
  loaded) where it is not, and goes through the registry.

The images are small on purpose (the CPU default's base plus two small layers, built by
`stackpin build` from a template of the test's own, in the cell SITES_CELL): the site path,
not torch, is under test. docs/benchmarks.md has the same steps timed on the CPU image.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, stackpin_cli
from tests.integration.conftest import matrix_hosts
from tests.integration.loopback import free_port, netns
from tests.integration.small_cell import _rewrite, small_project
from tests.tools import missing, need_docker_plugin, need_tool

from stackpin.bundle.delta import chain_ids
from stackpin.engine.docker_api import DockerEngine
from stackpin.render import DOCKERFILES

pytestmark = pytest.mark.docker

SITES_CELL = "sites-bookworm-py311"
HERE = Path(__file__).resolve().parent
# The old image: the base, the in-image tree, a 16 MiB layer. The new one adds a layer on
# top, as a changed stack pin does on the CPU image (its layers above torch are rebuilt).
OLD_TEMPLATE = """\
# Site-path image for cell {{ cell.id }}, variant {{ variant }}: small on purpose.
FROM {{ base_reference }}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY stackpin/ /opt/stackpin/
RUN python3 -m venv --without-pip /opt/stackpin/venv \\
    && mkdir -p /opt/stackpin/data && echo {{ cell.id }} > /opt/stackpin/data/cell \\
    && python3 -c 'import random, sys; sys.stdout.buffer.write(random.Random(25).randbytes(16 << 20))' > /opt/stackpin/data/noise \\
    && chmod 0755 /opt/stackpin/entrypoint.sh
{% include "fragments/labels.j2" %}
ENTRYPOINT ["/opt/stackpin/entrypoint.sh"]
CMD ["cat", "/opt/stackpin/data/cell"]
"""
NEW_LAYER = "RUN echo 'the stack changed' > /opt/stackpin/data/stack\n"
NEW_TEMPLATE = OLD_TEMPLATE.replace("{% include", NEW_LAYER + "{% include", 1)


@dataclass(frozen=True, kw_only=True)
class Site:
    name: str
    host: str
    engine: DockerEngine

    def netns(self) -> list[str]:
        return netns(self.name)


def _sites() -> dict[str, str]:
    return {name: host for name, host in matrix_hosts() if name.startswith("docker28")}


@pytest.fixture(scope="module")
def sites() -> Iterator[dict[str, Site]]:
    """The Docker 28 engines of the matrix, classic and containerd stores, as two sites."""
    hosts = _sites()
    for name in ("docker28-classic", "docker28-containerd"):
        if name not in hosts or not Path(f"/run/netns/stackpin-{name}").exists():
            missing(f"the Docker 28 engine {name} is not running: run bash scripts/setup-host.sh "
                    "--engines")
    for tool in ("skopeo", "docker-registry", "curl", "nsenter"):
        need_tool(tool)
    engines = {name: DockerEngine.connect(environ={**os.environ, "DOCKER_HOST": host})
               for name, host in hosts.items() if name in ("docker28-classic",
                                                           "docker28-containerd")}
    yield {name: Site(name=name, host=hosts[name], engine=engine)
           for name, engine in engines.items()}
    for engine in engines.values():
        _remove_cell_images(engine)
        engine.close()


def _remove_cell_images(engine: DockerEngine) -> None:
    for info in engine.list_images(f"io.stackpin.cell={SITES_CELL}"):
        engine.remove_image(info.id, force=True)


def _project(source: Path, dest: Path, template: str) -> Path:
    """A copy of ``source`` whose CPU cell is SITES_CELL, built from ``template``."""
    return small_project(source, dest, cell=SITES_CELL, template=template)


def _build(checkout: Path) -> None:
    """Build SITES_CELL in ``checkout`` on the default engine, with BuildKit."""
    need_docker_plugin("buildx")
    done = stackpin_cli("build", SITES_CELL, "--builder", "buildkit", cwd=checkout)
    assert done.returncode == 0, done.stdout + done.stderr


def _export(checkout: Path, out: Path, keys: Path, *, against: Path | None = None) -> Path:
    """Export the built SITES_CELL image, signed, at ``out`` (a delta ``against``)."""
    if not keys.exists():
        assert stackpin_cli("keys", "generate", "-o", str(keys), cwd=checkout).returncode == 0
    args = ["bundle", "export", SITES_CELL, "-o", str(out), "--sign-key",
            str(keys / "stackpin.key"), "--force"]
    if against is not None:
        args += ["--against", str(against)]
    done = stackpin_cli(*args, cwd=checkout)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def bundles(cpu_project: Path, tmp_path_factory: pytest.TempPathFactory,
            sites: dict[str, Site]) -> Iterator[dict[str, Path]]:
    """The old image's bundle, and the public key (both images are built in turn later)."""
    if stackpin_cli("wheels", "verify", CPU_CELL, cwd=cpu_project).returncode:
        done = stackpin_cli("wheels", "fetch", CPU_CELL, cwd=cpu_project)
        assert done.returncode == 0, done.stdout + done.stderr
    work = tmp_path_factory.mktemp("sites")
    checkout = _project(cpu_project, work / "checkout", OLD_TEMPLATE)
    _build(checkout)
    old = _export(checkout, work / "old", work / "keys")
    yield {"old": old, "pubkey": work / "keys" / "stackpin.pub", "work": work,
           "checkout": checkout}
    with DockerEngine.connect() as default:
        _remove_cell_images(default)


def _script(bundle: Path, name: str, *args: str, site: Site | None = None,
            env: dict[str, str] | None = None, timeout: int = 900,
            ) -> subprocess.CompletedProcess[str]:
    prefix = site.netns() if site else []
    environ = {**os.environ, **({"DOCKER_HOST": site.host} if site else {}), **(env or {})}
    return subprocess.run([*prefix, "bash", str(bundle / "bin" / name), *args],
                          capture_output=True, text=True, timeout=timeout, env=environ)


def _manifest(bundle: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((bundle / "manifest.json").read_bytes())


@pytest.fixture
def registry(sites: dict[str, Site], bundles: dict[str, Path], tmp_path: Path,
             ) -> Iterator[tuple[str, Path]]:
    """bin/registry.sh's registry in the classic engine's namespace: (address, data dir)."""
    site = sites["docker28-classic"]
    address = f"127.0.0.1:{free_port()}"
    env = {"STACKPIN_REGISTRY_DIR": str(tmp_path / "registry")}
    done = _script(bundles["old"], "registry.sh", "start", "--listen", address, site=site,
                   env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    yield address, tmp_path / "registry"
    _script(bundles["old"], "registry.sh", "stop", site=site, env=env)


def _layers(bundle: Path) -> dict[str, int]:
    """The bundle's layer blobs and their sizes, from its own OCI layout."""
    listing = subprocess.run(
        f"zstd -dc {bundle / 'images.tar.zst'} | tar -tv", shell=True, capture_output=True,
        text=True, check=True).stdout.splitlines()
    sizes = {}
    for line in listing:
        fields = line.split()
        if fields[-1].startswith("blobs/sha256/") and int(fields[2]) > 4096:
            sizes[f"sha256:{fields[-1].rsplit('/', 1)[1]}"] = int(fields[2])
    return sizes


def _held_blobs(data: Path) -> set[str]:
    """The blobs the registry has committed (distribution's storage layout)."""
    root = data / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
    return {f"sha256:{p.parent.name}" for p in root.glob("*/*/data")} if root.exists() else set()


def _linked_blobs(data: Path) -> set[str]:
    """The blobs some repository links (its _layers/sha256/<hex>/link): what a HEAD on the
    repository's blob answers for. A blob committed but not yet linked when the client dies
    is sent again, rightly: the registry does not say it has it."""
    root = data / "data" / "docker" / "registry" / "v2" / "repositories"
    return {f"sha256:{Path(folder).name}" for folder, _dirs, files in os.walk(root)
            if "link" in files and Path(folder).parent.name == "sha256"
            and Path(folder).parent.parent.name == "_layers"}


def _settled(data: Path, layers: set[str], count: Path) -> tuple[set[str], int]:
    """The layers the registry holds for the repository, and the proxy's byte count, once
    both stop moving after the client died: a blob whose upload had fully arrived is still
    committed and linked server side, and what was in flight still drains through the
    proxy (it belongs to the first push). Both still for 1 s; at most 15 s."""
    def state() -> tuple[frozenset[str], frozenset[str], int]:
        return (frozenset(_held_blobs(data) & layers), frozenset(_linked_blobs(data) & layers),
                int(count.read_text()))

    last, still = state(), 0
    for _ in range(300):
        time.sleep(0.05)
        now = state()
        still = still + 1 if now == last else 0
        if still >= 20 and now[0] <= now[1]:
            return set(now[1]), now[2]
        last = now
    msg = f"the registry or the proxy kept moving 15 s after the kill: {last}"
    raise AssertionError(msg)


def _uploading(data: Path) -> bool:
    """Some upload is under way: distribution keeps its data under _uploads/<uuid>/data.

    The registry removes an upload's folder when it commits the blob, at any moment of the
    walk (a CI run once met FileNotFoundError inside glob): a folder gone is no upload."""
    root = data / "data" / "docker" / "registry" / "v2" / "repositories"
    for folder, _dirs, files in os.walk(root):
        if Path(folder).parent.name == "_uploads" and "data" in files:
            try:
                if (Path(folder) / "data").stat().st_size > 0:
                    return True
            except FileNotFoundError:
                continue
    return False


def _push_through(proxy: int, bundle: Path, site: Site, pubkey: Path, *,
                  kill_when: object = None) -> subprocess.CompletedProcess[str] | None:
    command = [*site.netns(), "bash", str(bundle / "bin" / "push.sh"),
               f"127.0.0.1:{proxy}/site", "--plain-http", "--pubkey", str(pubkey)]
    if kill_when is None:
        return subprocess.run(command, capture_output=True, text=True, timeout=900)
    push = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while not kill_when() and push.poll() is None and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    assert push.poll() is None, "the push ended before the test could cut it: " + str(
        push.communicate())
    os.killpg(push.pid, signal.SIGKILL)  # the client dies mid-blob: no clean-up of its own
    push.wait()
    return None


def test_a_killed_push_resumes_and_a_node_pulls_the_signed_digests(
        sites: dict[str, Site], bundles: dict[str, Path], registry: tuple[str, Path],
        tmp_path: Path) -> None:
    site = sites["docker28-classic"]
    address, data = registry
    old, pubkey = bundles["old"], bundles["pubkey"]
    layers = _layers(old)
    assert len(layers) >= 3, layers
    count = tmp_path / "sent"
    proxy_port = free_port()
    # 24 MiB/s: the push takes seconds, long enough to stop it half-way.
    proxy = subprocess.Popen([*site.netns(), sys.executable, str(HERE / "throttle.py"),
                              str(proxy_port), address.rsplit(":", 1)[1], str(24 << 20),
                              str(count)], start_new_session=True)
    try:
        for _ in range(100):
            if count.exists():
                break
            time.sleep(0.1)
        # Killed once the registry holds a layer and another upload is under way.
        _push_through(proxy_port, old, site, pubkey,
                      kill_when=lambda: bool(_held_blobs(data) & set(layers)) and _uploading(data))
        held, first = _settled(data, set(layers), count)
        assert held and held != set(layers), held
        count.write_text("0\n")
        # The meter keeps its own total: the second push's bytes are the difference.
        done = _push_through(proxy_port, old, site, pubkey)
        assert done is not None and done.returncode == 0, done.stdout + done.stderr
        second = int(count.read_text()) - first
        owed = sum(size for digest, size in layers.items() if digest not in held)
        # Everything the registry lacked went again, and nothing it held: the headers,
        # manifest and config are far below the 1 MiB of slack.
        assert owed <= second <= owed + (1 << 20), (second, owed, held)
        assert set(layers) <= _held_blobs(data)
    finally:
        os.killpg(proxy.pid, signal.SIGTERM)
        proxy.wait()

    # An unchanged image pushed again sends no layer at all (HEAD says the registry has it).
    done = _script(old, "push.sh", f"{address}/site", "--plain-http", "--pubkey", str(pubkey),
                   site=site)
    assert done.returncode == 0, done.stdout + done.stderr

    # The node: only the bundle's small files, its engine, the registry.
    node = tmp_path / "node"
    node.mkdir()
    for name in ("manifest.json", "manifest.sig", "SHA256SUMS"):
        shutil.copy(old / name, node / name)
    shutil.copytree(old / "bin", node / "bin")
    (image,) = _manifest(old)["images"]
    _remove_cell_images(site.engine)
    done = _script(node, "pull.sh", f"{address}/site", "--pubkey", str(pubkey), site=site)
    assert done.returncode == 0, done.stdout + done.stderr
    repo = f"{address}/site/{image['tags'][0].rsplit(':', 1)[0]}"
    assert f"PASS  pulled stable: {repo}@{image['manifest_digest']} is image" in done.stdout
    pulled = site.engine.image_info(image["tags"][0])
    assert pulled is not None and pulled.id == image["config_digest"]
    assert f"{repo}@{image['manifest_digest']}" in pulled.repo_digests

    # A registry that serves other bytes for a signed layer: the engine refuses the pull,
    # pull.sh says so in one line, and no image of the bundle is left on the node.
    _remove_cell_images(site.engine)
    smallest = min(layers, key=layers.__getitem__)
    blob = next((data / "data").glob(f"docker/registry/v2/blobs/sha256/*/{smallest[7:]}/data"))
    original = blob.read_bytes()
    blob.write_bytes(original[:100] + bytes([original[100] ^ 1]) + original[101:])
    try:
        done = _script(node, "pull.sh", f"{address}/site", "--pubkey", str(pubkey), site=site)
        assert done.returncode == 8, done.stdout + done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"FAIL  pull of {repo}@{image['manifest_digest']} failed:")
        assert site.engine.image_info(image["config_digest"]) is None
    finally:
        blob.write_bytes(original)

    # Sealed read-only once seeded: pulls go on, pushes are refused.
    done = _script(old, "registry.sh", "start", "--listen", address, "--read-only", site=site,
                   env={"STACKPIN_REGISTRY_DIR": str(data)})
    assert done.returncode == 0, done.stdout + done.stderr
    done = _script(node, "pull.sh", f"{address}/site", "--pubkey", str(pubkey), site=site)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _script(old, "push.sh", f"{address}/other", "--plain-http", "--pubkey", str(pubkey),
                   site=site)
    assert done.returncode == 8, done.stdout + done.stderr
    assert "FAIL  push of stable to" in done.stderr


def test_a_delta_loads_where_the_old_image_is_and_is_refused_where_it_is_not(
        sites: dict[str, Site], bundles: dict[str, Path], registry: tuple[str, Path],
        tmp_path: Path) -> None:
    old, pubkey, work = bundles["old"], bundles["pubkey"], bundles["work"]
    classic, containerd = sites["docker28-classic"], sites["docker28-containerd"]
    old_image = _manifest(old)["images"][0]
    for site in (classic, containerd):
        _remove_cell_images(site.engine)
        done = _script(old, "load.sh", "--pubkey", str(pubkey), site=site)
        assert done.returncode == 0, done.stdout + done.stderr
    # The classic site's inventory (the containerd site loaded the same bundle).
    inventory = tmp_path / "site.inventory"
    done = _script(old, "inventory.sh", "-o", str(inventory), site=classic)
    assert done.returncode == 0, done.stderr
    # Seed the registry with the old image, as a site with a registry holds it.
    address, _data = registry
    done = _script(old, "push.sh", f"{address}/site", "--plain-http", "--pubkey", str(pubkey),
                   site=classic)
    assert done.returncode == 0, done.stdout + done.stderr

    # The new image: built in the same checkout, its template one layer longer.
    checkout = bundles["checkout"]
    for builder_template in DOCKERFILES.values():
        _rewrite(checkout / "templates" / builder_template, NEW_TEMPLATE)
    _build(checkout)
    full = _export(checkout, work / "new-full", work / "keys")
    part = _export(checkout, work / "new-delta", work / "keys", against=inventory)
    new_image = _manifest(part)["images"][0]
    assert new_image["id"] == _manifest(full)["images"][0]["id"] != old_image["id"]
    delta_bytes = (part / "images.tar.zst").stat().st_size
    full_bytes = (full / "images.tar.zst").stat().st_size
    assert delta_bytes < full_bytes / 20, (delta_bytes, full_bytes)
    # Every layer it left out is one of the old image's, at the same place (its chain).
    old_diffs = sites["docker28-classic"].engine.image_info(old_image["config_digest"])
    assert old_diffs is not None
    base = [b["chain_id"] for b in new_image["base_layers"]]
    assert base and set(base) <= set(chain_ids(list(old_diffs.diff_ids)))

    # A site without the old image: refused in one line, nothing loaded.
    _remove_cell_images(containerd.engine)
    done = _script(part, "load.sh", "--pubkey", str(pubkey), site=containerd)
    assert done.returncode == 7, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    # The engine may hold the lowest layers through another image (the CPU base); the
    # old image's own top layer it cannot hold, so that one is named.
    assert line.startswith("FAIL  delta bundle: ") and "absent from this docker engine" in line
    assert base[-1] in line
    assert containerd.engine.image_info(new_image["manifest_digest"]) is None

    # Both stores, holding the old image, load the delta into the whole new image.
    done = _script(old, "load.sh", "--pubkey", str(pubkey), site=containerd)
    assert done.returncode == 0, done.stdout + done.stderr
    for site in (classic, containerd):
        done = _script(part, "load.sh", "--pubkey", str(pubkey), site=site)
        assert done.returncode == 0, done.stdout + done.stderr
        loaded = site.engine.image_info(new_image["tags"][0])
        expected = site.engine.version().image_id(config_digest=new_image["config_digest"],
                                                  manifest_digest=new_image["manifest_digest"])
        assert loaded is not None and loaded.id == expected, site.name
        ran = subprocess.run(["docker", "run", "--rm", expected, "cat",
                              "/opt/stackpin/data/stack"], capture_output=True, text=True,
                             env={**os.environ, "DOCKER_HOST": site.host}, timeout=300)
        assert ran.stdout.strip() == "the stack changed", ran.stderr

    # Through the registry: refused where the old layers are absent, pushed where they are,
    # and a node holding the old image pulls the new one by its signed digest.
    done = _script(part, "push.sh", f"{address}/empty", "--plain-http", "--pubkey", str(pubkey),
                   site=classic)
    assert done.returncode == 7, done.stdout + done.stderr
    assert "delta bundle: " in done.stderr and "absent from registry" in done.stderr
    done = _script(part, "push.sh", f"{address}/site", "--plain-http", "--pubkey", str(pubkey),
                   site=classic)
    assert done.returncode == 0, done.stdout + done.stderr
    classic.engine.remove_image(new_image["config_digest"], force=True)
    done = _script(part, "pull.sh", f"{address}/site", "--pubkey", str(pubkey), site=classic)
    assert done.returncode == 0, done.stdout + done.stderr
    assert classic.engine.image_info(new_image["config_digest"]) is not None
