"""The classic builder's side of a build: the context tar, the call's arguments, and a
pure fold over the daemon's JSON events (step count, cache hits, the failing step)."""

from __future__ import annotations

import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import docker.utils.build

from stackpin.engine.types import BuildRequest
from stackpin.errors import BuildError

_STEP_LINE = re.compile(r"^Step \d+/\d+ : ")
_CACHE_HIT = "---> Using cache"

# --- build output: a pure fold over the daemon's JSON events -------------------------


@dataclass(frozen=True, kw_only=True)
class BuildTally:
    """What a build stream said so far."""

    steps: int = 0
    cached_steps: int = 0
    current_step: str = ""
    image_id: str = ""
    error: str = ""
    partial: str = ""  # text after the last newline, completed by the next event


def tally_build_event(tally: BuildTally, event: Mapping[str, Any]) -> tuple[BuildTally, list[str]]:
    """Fold one decoded daemon event into the tally; return it and the complete lines."""
    if "error" in event:
        message = str(event.get("error") or (event.get("errorDetail") or {}).get("message", ""))
        return replace(tally, error=" ".join(message.split()) or "unknown error"), [
            f"ERROR: {message.strip()}"
        ]
    aux = event.get("aux")
    if isinstance(aux, Mapping) and "ID" in aux:
        tally = replace(tally, image_id=str(aux["ID"]))
    if "stream" in event:
        text = tally.partial + str(event["stream"])
        *lines, partial = text.split("\n")
        tally = replace(tally, partial=partial)
        for line in lines:
            tally = _count_line(tally, line)
        return tally, lines
    if "status" in event and "progress" not in event:
        return tally, [" ".join(str(event[k]) for k in ("id", "status") if event.get(k))]
    return tally, []


def _count_line(tally: BuildTally, line: str) -> BuildTally:
    stripped = line.strip()
    if _STEP_LINE.match(stripped):
        return replace(tally, steps=tally.steps + 1, current_step=stripped)
    if stripped.startswith(_CACHE_HIT):
        return replace(tally, cached_steps=tally.cached_steps + 1)
    return tally


def finish_build_stream(tally: BuildTally) -> tuple[BuildTally, list[str]]:
    """Flush the last unterminated line, if any."""
    if not tally.partial:
        return tally, []
    line = tally.partial
    return _count_line(replace(tally, partial=""), line), [line]


def build_failure(tally: BuildTally, log_path: Path) -> BuildError:
    """The one-line error for a failed classic build."""
    return failed_build(tally.current_step, tally.error, log_path)


# What a step prints when the Docker host's disk filled under it (overlay2 writes, pip, tar).
_DISK_FULL = "no space left on device"


def failed_build(step: str, reason: str, log_path: Path) -> BuildError:
    """The one-line error for a failed build of either builder: the failing step, the reason,
    the way out where the reason is a full disk (it reads like the step's own fault), and
    the log."""
    where = step or "before the first step (context or Dockerfile)"
    hint = ""
    if _DISK_FULL in reason.lower():
        hint = (" (the Docker host's disk is full, not the step: see `docker system df`, "
                "remove images you no longer need, and rerun)")
    return BuildError(f"build failed at {where}: {reason}{hint}; full log: {log_path}",
                      step=step, log_path=str(log_path))


def build_kwargs(request: BuildRequest) -> dict[str, Any]:
    """Arguments of the SDK's low-level build call for a request."""
    return {
        # stackpin writes the context tar itself (write_build_context), not the SDK.
        "custom_context": True,
        "dockerfile": request.dockerfile,
        "labels": dict(request.labels),
        "buildargs": dict(request.buildargs),
        "network_mode": request.network_mode,
        "nocache": request.nocache,
        "pull": request.pull,
        "rm": request.rm,
        "forcerm": request.forcerm,
        "decode": True,
        # Proxy settings from ~/.docker/config.json would leak into every build as
        # build args: an offline build must not depend on the host's client config.
        "use_config_proxy": False,
    }


def write_build_context(
    context_dir: Path, out: IO[bytes], *, dockerfile: str, source_date_epoch: int | None
) -> None:
    """The context tar, the same bytes whatever the checkout time, umask or owner.

    The classic builder copies mode and mtime from the context into COPY layers, so a
    file checked out under umask 002 or a day later would change the layer. Entries are
    sorted, owned by 0:0, modes reduced to 0644/0755 and mtimes clamped. ``.dockerignore``
    is honoured with the SDK's own matcher, so it means what ``docker build`` makes of it.
    """
    patterns = _dockerignore_patterns(context_dir)
    names = sorted(docker.utils.build.exclude_paths(str(context_dir), patterns, dockerfile))
    # Stream mode ("w|"): the same bytes as "w", and it never asks a pipe for its offset.
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for name in names:
            path = context_dir / name
            info = tar.gettarinfo(str(path), arcname=name)
            if info is None:  # a socket: docker build skips those too
                continue
            _normalize_member(info, source_date_epoch)
            if info.isfile():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)


def _dockerignore_patterns(context_dir: Path) -> list[str]:
    ignore = context_dir / ".dockerignore"
    if not ignore.is_file():
        return []
    lines = (line.strip() for line in ignore.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _normalize_member(info: tarfile.TarInfo, source_date_epoch: int | None) -> None:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.isdir():
        info.mode = 0o755
    elif not info.issym():
        info.mode = 0o755 if info.mode & 0o100 else 0o644
    mtime = int(info.mtime)
    info.mtime = mtime if source_date_epoch is None else min(mtime, source_date_epoch)
