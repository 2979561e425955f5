"""A cell's base image: bootstrapped from Debian packages, or an image reference.

A bootstrap base is a minimal Debian rootfs built by mmdebstrap with a fixed
SOURCE_DATE_EPOCH and hooks that drop host- and time-dependent files, so the same
request against the same mirror state gives a byte-identical tar (issue 7). The tar is
cached under a digest of the request and loaded as a one-layer image whose config is
written here (fixed ``created``, canonical JSON), so the image ID is a function of the
rootfs bytes alone and the same on every host. ``docker import`` would stamp the
current time into the config instead.

An image-reference base is used if present, loaded from a user-given ``docker save``
tar (the normal case on an air-gapped site), else pulled; then checked against the
pinned ``sha256:``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from stackpin.engine import Engine, ImageInfo, digest_matches
from stackpin.engine.save_format import image_layout
from stackpin.errors import BuildError, ConfigurationError, HostEnvironmentError, ValidationError
from stackpin.matrix import Cell
from stackpin.primitives import canonical_bytes, rfc3339, sha256_file
from stackpin.target import LABEL_BOOTSTRAP_DIGEST

# Debian architecture names for the cell's cpu_arch (uname -m spelling).
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el", "s390x": "s390x"}
# The maybe-merged-usr hook sets up merged /usr the way debootstrap does and installs
# usr-is-merged; without it bookworm's init-system-helpers pulls usrmerge and, through
# it, full perl (about 95 MB of a 210 MB rootfs). It falls back to no-op on old suites.
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/maybe-merged-usr"
# Docs, man pages and translations are not needed to run Python; copyright files stay
# for license compliance. These dpkg options persist into the image like debian:slim.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
# Each hook removes something that differs between runs or leaks the build host.
CUSTOMIZE_HOOKS = (
    # Log files carry timestamps; keep the (empty) files for their owners and modes.
    'find "$1/var/log" -type f -exec truncate --size=0 {} +',
    'find "$1/var/cache/apt" "$1/var/lib/apt/lists" -type f -delete',
    # ldconfig's aux-cache and machine ids are per run; the *-old files are backups
    # of the previous state; hostname and resolv.conf are copied from the build host
    # (Docker mounts its own at run time).
    'rm -f "$1/var/cache/ldconfig/aux-cache" "$1/var/lib/dbus/machine-id"'
    ' "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old'
    ' "$1/etc/hostname" "$1/etc/resolv.conf"',
    # systemd semantics: an empty machine-id means "not yet initialised".
    'if [ -e "$1/etc/machine-id" ]; then : > "$1/etc/machine-id"; fi',
    # Debian's postinst byte-compiles with timestamps and hash-seed-dependent marshal
    # output; Python recompiles on demand.
    'find "$1/usr" -depth -type d -name __pycache__ -exec rm -rf {} +',
)
IMAGE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
IMAGE_CMD = ("/bin/bash",)
DIGEST_LABEL = LABEL_BOOTSTRAP_DIGEST
CLEANUP_TIMEOUT_S = 120


def _ignore(_line: str) -> None:
    """Default progress sink."""


@dataclass(frozen=True, kw_only=True)
class BootstrapRequest:
    """Everything that decides the bytes of a bootstrapped rootfs."""

    suite: str
    mirror: str
    packages: tuple[str, ...]
    variant: str = "minbase"
    source_date_epoch: int
    architecture: str = "amd64"


@dataclass(frozen=True, kw_only=True)
class ResolvedBase:
    """The base image a build starts FROM."""

    reference: str
    image_id: str
    origin: Literal["bootstrap", "local", "tar", "pull"]


# --- pure: request, argv, digest, image config ------------------------------------------


def bootstrap_request(cell: Cell) -> BootstrapRequest:
    """The bootstrap request of a cell whose base is a ``bootstrap`` spec."""
    spec = cell.base.bootstrap
    if spec is None:
        msg = f"cell '{cell.id}' has an image base ({cell.base.image}), not a bootstrap spec"
        raise ConfigurationError(msg)
    if cell.cpu_arch not in DEBIAN_ARCH:
        known = ", ".join(sorted(DEBIAN_ARCH))
        msg = f"cell '{cell.id}': cpu_arch {cell.cpu_arch!r} has no Debian name; use one of {known}"
        raise ConfigurationError(msg)
    return BootstrapRequest(
        suite=spec.suite,
        mirror=spec.mirror,
        # Sorted and unique: the order in the matrix must not change the digest.
        packages=tuple(sorted(set(spec.packages))),
        variant=spec.mmdebstrap_variant,
        source_date_epoch=cell.source_date_epoch,
        architecture=DEBIAN_ARCH[cell.cpu_arch],
    )


def mmdebstrap_argv(req: BootstrapRequest, out_tar: Path) -> list[str]:
    """The mmdebstrap command line that writes the rootfs tar to ``out_tar``."""
    argv = [
        "mmdebstrap",
        f"--variant={req.variant}",
        f"--architectures={req.architecture}",
        "--format=tar",
        f"--hook-dir={MERGED_USR_HOOKS}",
    ]
    if req.packages:
        argv.append(f"--include={','.join(req.packages)}")
    argv += [f"--dpkgopt={option}" for option in DPKG_OPTIONS]
    argv += [f"--customize-hook={hook}" for hook in CUSTOMIZE_HOOKS]
    return [*argv, req.suite, str(out_tar), req.mirror]


def mmdebstrap_env(req: BootstrapRequest) -> dict[str, str]:
    """Environment additions: mmdebstrap clamps every mtime to SOURCE_DATE_EPOCH."""
    return {"SOURCE_DATE_EPOCH": str(req.source_date_epoch)}


def request_digest(req: BootstrapRequest) -> str:
    """sha256 (hex) of the exact command and environment: a hook change is a new base."""
    recipe = {"argv": mmdebstrap_argv(req, Path("rootfs.tar")), "env": mmdebstrap_env(req)}
    return hashlib.sha256(canonical_bytes(recipe, ascii_only=True)).hexdigest()


def base_reference(req: BootstrapRequest) -> str:
    return f"stackpin/base-{req.suite}:{request_digest(req)[:12]}"


def rootfs_path(req: BootstrapRequest, cache_dir: Path) -> Path:
    return cache_dir / f"rootfs-{req.suite}-{request_digest(req)[:12]}.tar"


def image_config(req: BootstrapRequest, *, diff_id: str) -> bytes:
    """The image config JSON: canonical bytes, so its digest (the image ID) is stable."""
    created = rfc3339(req.source_date_epoch)
    config = {
        "architecture": req.architecture,
        "os": "linux",
        "created": created,
        "config": {
            "Env": list(IMAGE_ENV),
            "Cmd": list(IMAGE_CMD),
            "Labels": {DIGEST_LABEL: request_digest(req)},
        },
        "history": [{"created": created, "created_by": _describe(req)}],
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    return canonical_bytes(config, ascii_only=True)


def _describe(req: BootstrapRequest) -> str:
    packages = ",".join(req.packages) or "-"
    return (
        f"stackpin bootstrap: mmdebstrap --variant={req.variant} {req.suite} {req.mirror}"
        f" include={packages} SOURCE_DATE_EPOCH={req.source_date_epoch}"
    )


# --- side effects: mmdebstrap, cache, load ------------------------------------------------


def bootstrap_image(
    engine: Engine,
    req: BootstrapRequest,
    *,
    cache_dir: Path,
    on_line: Callable[[str], None] = _ignore,
) -> str:
    """The reference of the bootstrapped base, built and loaded only when missing."""
    reference = base_reference(req)
    present = engine.image_info(reference)
    # The label guards against a tag that someone pointed at another image.
    if present is not None and present.labels.get(DIGEST_LABEL) == request_digest(req):
        on_line(f"base: {reference} is already loaded; reusing it")
        return reference
    rootfs = rootfs_path(req, cache_dir)
    if rootfs.exists():
        on_line(f"base: reusing the cached rootfs {rootfs}")
    else:
        run_mmdebstrap(req, rootfs, on_line=on_line)
    info = load_rootfs(engine, req, rootfs)
    on_line(f"base: loaded {reference} (image {info.id})")
    return reference


def run_mmdebstrap(
    req: BootstrapRequest, rootfs: Path, *, on_line: Callable[[str], None] = _ignore
) -> None:
    """Build the rootfs tar under a temporary name, then rename it into place."""
    if shutil.which("mmdebstrap") is None:
        msg = "mmdebstrap not found: apt-get install mmdebstrap"
        raise HostEnvironmentError(msg)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    partial = rootfs.with_name(f".{rootfs.name}.{uuid.uuid4().hex}.partial")
    log_path = rootfs.with_suffix(".log")
    packages = ", ".join(req.packages) or "no extra packages"
    on_line(f"base: bootstrapping Debian {req.suite} ({packages}) from {req.mirror}")
    try:
        with log_path.open("w", encoding="utf-8") as log:
            returncode = _run_to_end(
                mmdebstrap_argv(req, partial), env={**os.environ, **mmdebstrap_env(req)}, log=log
            )
        if returncode != 0:
            msg = (
                f"mmdebstrap failed (exit {returncode}) bootstrapping {req.suite} from"
                f" {req.mirror}: see {log_path}; check the mirror answers and the packages exist"
            )
            raise BuildError(
                msg,
                step="mmdebstrap",
                log_path=str(log_path),
            )
        partial.replace(rootfs)
    finally:
        partial.unlink(missing_ok=True)
    on_line(f"base: rootfs {rootfs} ({rootfs.stat().st_size / 2**20:.0f} MiB)")


def _run_to_end(argv: list[str], *, env: dict[str, str], log: IO[str]) -> int:
    """Run a command; on Ctrl-C let it clean up before we give up on it.

    mmdebstrap unmounts /proc and /sys from its chroot and removes its temp dir when it
    gets TERM; subprocess.run would KILL it 0.25 s after an interrupt and leave both.
    """
    process = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        return process.wait()
    except BaseException:
        process.terminate()
        try:
            process.wait(timeout=CLEANUP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise


def load_rootfs(engine: Engine, req: BootstrapRequest, rootfs: Path) -> ImageInfo:
    """Load the cached rootfs as the image ``base_reference(req)``."""
    reference = base_reference(req)
    diff_id = f"sha256:{sha256_file(rootfs)}"
    layout = image_layout(image_config(req, diff_id=diff_id), [(diff_id, rootfs)],
                          tags=(reference,), mtime=req.source_date_epoch)
    engine.load(layout.chunks)
    info = engine.image_info(reference)
    if info is None:
        msg = f"the Docker daemon loaded {rootfs} but has no {reference}; see `docker images`"
        raise HostEnvironmentError(msg)
    return info


# --- image-reference bases ------------------------------------------------------------------


def ensure_base(
    engine: Engine,
    cell: Cell,
    *,
    cache_dir: Path,
    base_tar: Path | None = None,
    on_line: Callable[[str], None] = _ignore,
    rehearsal_base: Callable[..., str] | None = None,
) -> ResolvedBase:
    """Make the cell's base present locally and check it against the pinned digest.

    ``rehearsal_base`` makes a rehearsal cell's base (``stackpin.rehearsal_base.ensure``,
    passed in by the session: that module builds on this one, so this one cannot import it).
    """
    origin: Literal["bootstrap", "local", "tar", "pull"]
    reference = cell.base.image
    if cell.base.bootstrap is not None and base_tar is not None:
        msg = f"cell '{cell.id}' bootstraps its base; --base-tar applies to image bases only"
        raise ConfigurationError(msg)
    if cell.rehearsal is not None:
        # The stand-in vendor tree goes on the bootstrapped rootfs.
        if rehearsal_base is None:
            msg = f"cell '{cell.id}' is a vendor rehearsal: its base needs the rehearsal base maker"
            raise ConfigurationError(msg)
        reference = rehearsal_base(engine, cell, cache_dir=cache_dir, on_line=on_line)
        info, origin = _present(engine, reference), "bootstrap"
    elif cell.base.bootstrap is not None:
        reference = bootstrap_image(
            engine, bootstrap_request(cell), cache_dir=cache_dir, on_line=on_line
        )
        info, origin = _present(engine, reference), "bootstrap"
    elif base_tar is not None:
        info, origin = _load_base_tar(engine, cell, base_tar), "tar"
    elif (found := engine.image_info(reference)) is not None:
        info, origin = found, "local"
    else:
        on_line(f"base: {reference} is not here; pulling it")
        info, origin = engine.pull(reference), "pull"
    _check_digest(cell, reference, info, on_line)
    return ResolvedBase(reference=reference, image_id=info.id, origin=origin)


def _present(engine: Engine, reference: str) -> ImageInfo:
    info = engine.image_info(reference)
    if info is None:
        msg = f"base {reference} is missing right after it was loaded; see `docker images`"
        raise HostEnvironmentError(msg)
    return info


def _load_base_tar(engine: Engine, cell: Cell, base_tar: Path) -> ImageInfo:
    reference = cell.base.image
    if not base_tar.is_file():
        msg = f"base tar {base_tar} does not exist; pass the `docker save` tar of {reference}"
        raise HostEnvironmentError(msg)
    loaded = engine.load(base_tar)
    if reference not in loaded.references:
        # A tar saved by image ID carries no tag: accept it when it is the pinned image.
        if not cell.base.digest or cell.base.digest not in loaded.image_ids:
            held = ", ".join(loaded.references) or "no image"
            msg = f"{base_tar} holds {held}, not {reference}; pass the tar saved from {reference}"
            raise ValidationError(msg)
        engine.tag(cell.base.digest, reference)
    return _present(engine, reference)


def _check_digest(
    cell: Cell, reference: str, info: ImageInfo, on_line: Callable[[str], None]
) -> None:
    pinned = cell.base.digest
    if not pinned:
        on_line(f"base: {reference} is {info.id}; pin it with base.digest = \"{info.id}\"")
        return
    if not digest_matches(info, pinned):
        msg = (
            f"base {reference} is {info.id} here but cell '{cell.id}' pins {pinned}; load the"
            " pinned base (--base-tar) or update base.digest in the matrix"
        )
        raise ValidationError(msg)
