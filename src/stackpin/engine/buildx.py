"""BuildKit builds through ``docker buildx`` (the maintained BuildKit client), and the choice
between BuildKit and the classic builder.

The daemon's own BuildKit is used (buildx's ``docker`` driver, ``--builder default``): it
resolves ``FROM`` from the engine's local image store, which is where stackpin's
bootstrapped base lives on a host without a registry. A ``docker-container`` builder would
have to pull BuildKit's image first.

What each engine's BuildKit does with ``SOURCE_DATE_EPOCH`` (observed on Docker 20.10.24,
28.5.2 classic store and 28.5.2 containerd image store; docs/reproducibility.md):

- Engine 20.10 (BuildKit 0.8): ignores it; the config's dates are the build's, so stackpin
  normalises the image afterwards (as after a classic build).
- Engine 26+ (BuildKit 0.13+), either store: the config's ``created`` and history are
  clamped. The layers are clamped by the BuildKit Dockerfile's own steps (each ends with
  templates/clamp.py), so the image the exporter writes (``type=image``) is reproducible as
  built ("native" timestamps), with no normalisation. The classic store's image exporter
  has no ``rewrite-timestamp`` and the docker driver no tar exporter there; the containerd
  store's ``type=docker,dest=-,rewrite-timestamp=true`` streamed into ``docker load``
  (``rewrite_timestamps`` below) still works but is no longer chosen: it wrote and loaded
  the image a second time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from stackpin.engine.docker_build import failed_build, write_build_context
from stackpin.engine.types import BuildRequest
from stackpin.errors import BuildError, HostEnvironmentError
from stackpin.primitives import CHUNK

_STEP = re.compile(r"^#(\d+) \[(?:[^\]]*\s)?\d+/\d+\] (.*)$")
_CACHED = re.compile(r"^#(\d+) CACHED$")
_VERTEX_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")


def buildx_version() -> str:
    """`docker buildx version`'s version word, or "" without the docker CLI or the plugin."""
    if shutil.which("docker") is None:
        return ""
    done = subprocess.run(["docker", "buildx", "version"], capture_output=True, text=True,
                          check=False)
    words = done.stdout.split()
    return words[1] if done.returncode == 0 and len(words) > 1 else ""


# --- the command ---------------------------------------------------------------------------


def buildx_argv(request: BuildRequest, *, metadata_file: Path) -> list[str]:
    """The ``docker buildx build`` command for a request; the context tar comes on stdin."""
    argv = ["docker", "buildx", "build", "--builder", "default", "--progress", "plain",
            "--metadata-file", str(metadata_file),
            # Attestations carry build times and builder IDs: they would change the identity.
            "--provenance=false", "--sbom=false"]
    if request.dockerfile != "Dockerfile":
        argv += ["--file", request.dockerfile]
    if request.network_mode:
        argv += ["--network", request.network_mode]
    if request.nocache:
        argv.append("--no-cache")
    if request.pull:
        argv.append("--pull")
    for tag in request.tags:
        argv += ["--tag", tag]
    for key, value in sorted(request.labels.items()):
        argv += ["--label", f"{key}={value}"]
    args = dict(request.buildargs)
    if request.source_date_epoch is not None:
        args.setdefault("SOURCE_DATE_EPOCH", str(request.source_date_epoch))
    for key, value in sorted(args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    if request.rewrite_timestamps:
        argv += ["--output", "type=docker,dest=-,rewrite-timestamp=true"]
    else:
        argv += ["--output", "type=image"]
    argv.append("-")
    return argv


# --- progress: a fold over buildx's plain output -------------------------------------------


@dataclass(kw_only=True)
class BuildkitTally:
    """What the plain progress said so far: steps by vertex, cache hits, the failure."""

    steps: dict[str, str] = field(default_factory=dict)  # vertex -> "[2/5] RUN ..."
    cached: set[str] = field(default_factory=set)
    current_step: str = ""
    failed_step: str = ""
    error: str = ""

    def add(self, line: str) -> None:
        text = line.rstrip()
        if match := _STEP.match(text):
            self.steps.setdefault(match.group(1), text.split(" ", 1)[1])
            self.current_step = self.steps[match.group(1)]
        elif match := _CACHED.match(text):
            self.cached.add(match.group(1))
        elif match := _VERTEX_ERROR.match(text):
            self.failed_step = self.steps.get(match.group(1), self.failed_step)
            self.error = self.error or match.group(2)
        elif text.startswith("ERROR: "):
            self.error = self.error or text.removeprefix("ERROR: ")

    @property
    def cached_steps(self) -> int:
        """Cache hits of real steps (BuildKit reports FROM as CACHED even with --no-cache)."""
        return sum(1 for vertex in self.cached
                   if vertex in self.steps and " FROM " not in f" {self.steps[vertex]}")


# --- running it ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BuildkitOutcome:
    image_id: str  # the engine's ID of the result (config digest, or manifest digest)
    tally: BuildkitTally


Loader = Callable[[Iterable[bytes]], tuple[str, ...]]  # chunks -> the loaded image IDs


def run_buildx(
    request: BuildRequest, *, docker_host: str, emit: Callable[[str], None], load: Loader,
) -> BuildkitOutcome:
    """Run buildx with the normalised context tar streamed to its stdin, its progress to ``emit``.

    The tar goes through a pipe, written by a thread as buildx reads it: a file first cost
    the CUDA cell's 3.1 GB once more on the disk (CI's enhanced build ran out of it there)
    and a write and a read of it. With ``rewrite_timestamps`` the image arrives on buildx's
    stdout and goes straight into ``load``; the ID buildx reports must be among the IDs the
    engine loaded.
    """
    tally = BuildkitTally()
    with tempfile.TemporaryDirectory(prefix="stackpin-buildx-") as tmp:
        metadata = Path(tmp) / "metadata.json"
        env = {**os.environ, "DOCKER_HOST": docker_host}
        with _process(buildx_argv(request, metadata_file=metadata), env=env,
                      stdout=request.rewrite_timestamps) as proc:
            writer = _ContextWriter(request, proc)
            reader = threading.Thread(target=_fold_lines, args=(proc.stderr, tally, emit))
            writer.start()
            reader.start()
            loaded = _load_output(proc.stdout, load) if proc.stdout else ()
            code = proc.wait()
            reader.join()
            writer.join()
        give_back_uploads(env, emit)
        writer.raise_failure()
        if code != 0 or tally.error:
            raise buildkit_failure(tally, request.log_path, code)
        image_id = _metadata_digest(metadata)
    if request.rewrite_timestamps and image_id not in loaded:
        msg = (f"buildx reported image {image_id} but the engine loaded "
               f"{', '.join(loaded) or 'nothing'}; full log: {request.log_path}")
        raise BuildError(msg, step="export", log_path=str(request.log_path))
    return BuildkitOutcome(image_id=image_id, tally=tally)


# The engine keeps each upload of a context on stdin as a build-cache record ("http url
# http://buildkit-session/<session>"), one per build and never read again (an identical
# context is found through its unpacked copy, "copy /context /", which stays): the CUDA
# cell's 3.1 GB a build. Records a running build uses are not pruned. BuildKit 0.8 (engine
# 20.10) ignores this filter and keeps them: scripts/reclaim-disk.sh is the way out there.
UPLOADS_FILTER = "description~=buildkit-session"


def give_back_uploads(env: dict[str, str], emit: Callable[[str], None]) -> None:
    """Prune the engine's idle context uploads; what was given back goes to ``emit``."""
    done = subprocess.run(["docker", "builder", "prune", "--force", "--filter", UPLOADS_FILTER],
                          env=env, capture_output=True, text=True, check=False)
    last = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    size = last[0].partition(":")[2].strip() if last else ""  # "Total:  3.273GB"
    if size not in ("", "0B"):
        emit(f"stackpin: gave back the engine's copy of the uploaded build context ({size})")


class _ContextWriter(threading.Thread):
    """Writes the context tar into buildx's stdin and closes it; keeps what went wrong.

    A pipe buildx closed early (it failed, and says why on stderr) is not this thread's
    failure; a context file that cannot be read is, and stops buildx at once.
    """

    def __init__(self, request: BuildRequest, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(name="stackpin-buildx-context", daemon=True)
        self.request, self.proc = request, proc
        self.failure: Exception | None = None

    def run(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            with stdin:
                write_build_context(self.request.context_dir, stdin,
                                    dockerfile=self.request.dockerfile,
                                    source_date_epoch=self.request.source_date_epoch)
        except BrokenPipeError:
            pass
        except Exception as exc:  # kept, and raised in the caller's thread
            self.failure = exc
            self.proc.terminate()

    def raise_failure(self) -> None:
        if self.failure is not None:
            msg = (f"could not send the build context {self.request.context_dir} to BuildKit: "
                   f"{self.failure}; full log: {self.request.log_path}")
            raise BuildError(msg, step="context", log_path=str(self.request.log_path))


@contextlib.contextmanager
def _process(argv: list[str], *, env: dict[str, str],
             stdout: bool) -> Iterator[subprocess.Popen[bytes]]:
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env, stderr=subprocess.PIPE,
                                stdout=subprocess.PIPE if stdout else subprocess.DEVNULL)
    except FileNotFoundError:
        msg = "docker CLI not found: install docker.io (or docker-ce-cli), or --builder classic"
        raise HostEnvironmentError(msg) from None
    try:
        yield proc
    finally:
        # Ctrl-C or a failed load: buildx cancels the build when it is terminated.
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _fold_lines(stream: IO[bytes], tally: BuildkitTally, emit: Callable[[str], None]) -> None:
    for raw in stream:
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        tally.add(line)
        emit(line)


def _load_output(stdout: IO[bytes], load: Loader) -> tuple[str, ...]:
    """Load buildx's tar unless the build produced none (it failed: its exit code says why)."""
    first = stdout.read(CHUNK)
    if not first:
        return ()

    def chunks() -> Iterator[bytes]:
        yield first
        while chunk := stdout.read(CHUNK):
            yield chunk

    return load(chunks())


def _metadata_digest(path: Path) -> str:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return str(data["containerimage.digest"])
    except (OSError, ValueError, KeyError):
        msg = f"buildx wrote no image digest to its metadata file {path.name}; upgrade buildx"
        raise HostEnvironmentError(msg) from None


def buildkit_failure(tally: BuildkitTally, log_path: Path, code: int) -> BuildError:
    return failed_build(tally.failed_step or tally.current_step,
                        tally.error or f"docker buildx exited {code}", log_path)
