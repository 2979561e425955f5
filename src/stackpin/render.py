"""Render a cell x variant into a Docker build context (pure: same input, same bytes).

The result is a mapping of relative path -> text: the Dockerfile, one hash-locked
requirements file per install layer, the build guard, the entrypoint and the image
description (``stackpin/image.json``) that the in-image verification reads. Wheel files
are not part of it: the build stages them beside these files. Render reads nothing: the
templates and the in-image programs come in as text (``Sources``, read at the edge by
``stackpin.context.read_sources``).
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
from packaging.utils import canonicalize_name

from stackpin import target
from stackpin.boundary import effective_provided
from stackpin.compat import compat_files
from stackpin.engine.builders import Builder
from stackpin.errors import ConfigurationError
from stackpin.layers import InstallLayer, install_layers
from stackpin.lock import GROUPS, Group, Lock, wheel_name_version
from stackpin.matrix import Cell, Variant, cell_json
from stackpin.primitives import pretty_json, rfc3339
from stackpin.rehearsalspec import RUN_KIND, describe
from stackpin.servicespec import Service
from stackpin.tools import Installer

# Where BuildKit's tools stage keeps the step clamp and uv; bind-mounted, never in the image.
TOOLS_MOUNT = "/opt/stackpin-tools"

# The Dockerfile of each builder. The classic builder has no RUN --mount: its wheels are
# copied into an install stage and the environment copied from there into the final one.
# BuildKit mounts each layer's wheels into its RUN, so one stage writes the environment
# once, with no wheel in any layer (issue 24: the second write was a suspected cost).
DOCKERFILES: dict[Builder, str] = {
    "classic": "Dockerfile.j2",
    "buildkit": "Dockerfile.buildkit.j2",
}


@dataclass(frozen=True, kw_only=True)
class Sources:
    """What render renders from, as text: every file of the templates folder by its path
    there (Dockerfiles, fragments, guard.py, serve.py, compat shims) and the image's health
    check (stackpin/healthcheck.py, which `stackpin serve` runs on the host too)."""

    templates: Mapping[str, str]
    healthcheck: str = ""

    def text(self, name: str) -> str:
        return self.templates[name]


@dataclass(frozen=True, kw_only=True)
class RenderRequest:
    cell: Cell
    variant: Variant
    lock: Lock | None
    sources: Sources
    stackpin_version: str
    builder: Builder = "classic"
    # The pinned installer (stackpin.tools): uv installs each layer; None: pip does (the
    # venv's own pip, as before issue 24; what a render without the tools pin shows).
    installer: Installer | None = None


@dataclass(frozen=True, kw_only=True)
class Rendered:
    files: Mapping[str, str]
    labels: Mapping[str, str]
    base_reference: str

    @property
    def dockerfile(self) -> str:
        return self.files["Dockerfile"]


def bootstrap_tag(cell: Cell) -> str:
    """Image reference of a bootstrapped base: a digest of the exact mmdebstrap recipe."""
    # Imported here: the recipe (argv, hooks) lives with the code that runs it.
    from stackpin.bootstrap import base_reference as bootstrap_reference
    from stackpin.bootstrap import bootstrap_request

    return bootstrap_reference(bootstrap_request(cell))


def base_reference(cell: Cell) -> str:
    """What FROM names: the bootstrapped tag, or the base image reference.

    A pinned digest is checked by the build before Docker starts, not written into FROM:
    a base loaded from a `docker save` tar (the usual air-gapped case) has no registry
    digest, and FROM name@sha256:<image id> would not resolve.
    """
    if cell.rehearsal is not None:
        # Imported here like the bootstrap recipe: the stand-in tree lives with its loader.
        from stackpin.rehearsal_base import reference as rehearsal_reference

        return rehearsal_reference(cell)
    if cell.base.bootstrap is not None:
        return bootstrap_tag(cell)
    return cell.base.image


def torch_version(cell: Cell) -> str:
    return wheel_name_version(cell.torch.filename)[1]


def image_tags(cell: Cell, variant: Variant, lock_digest: str) -> tuple[str, ...]:
    """The tags of a built image (stackpin.target.image_tags)."""
    return target.image_tags(cell.id, variant, lock_digest)


# The module each attention distribution is imported as (verify L0 imports it, L3 runs it).
# FlashAttention 4 installs into the flash_attn namespace beside where FA2 would be.
ATTENTION_MODULES = {"flash-attn": "flash_attn", "flash-attn-4": "flash_attn.cute"}


def attention_module(cell: Cell, variant: Variant) -> str:
    """What a variant attends with: the attention package's module, or sdpa."""
    if cell.attention is None or not cell.uses_attention(variant):
        return "sdpa"
    dist = str(canonicalize_name(cell.attention.filename.split("-")[0]))
    return ATTENTION_MODULES.get(dist, dist.replace("-", "_"))



def image_labels(req: RenderRequest) -> dict[str, str]:
    cell, lock = req.cell, req.lock
    lock_digest = lock.digest if lock else "unlocked"
    labels = {
        target.OCI_TITLE: f"stackpin/{cell.id}",
        target.OCI_DESCRIPTION: cell.description,
        target.OCI_VERSION: f"{req.variant}-{lock_digest[:12]}",
        target.OCI_CREATED: rfc3339(cell.source_date_epoch),
        target.OCI_VENDOR: "stackpin",
        target.OCI_BASE_NAME: base_reference(cell),
        target.LABEL_CELL: cell.id,
        target.LABEL_VARIANT: req.variant,
        target.LABEL_PLATFORM: cell.platform,
        target.LABEL_ATTENTION: attention_module(cell, req.variant),
        target.LABEL_LOCK_DIGEST: lock_digest,
        target.LABEL_SOURCE_DATE_EPOCH: str(cell.source_date_epoch),
        target.LABEL_VERSION: req.stackpin_version,
        target.LABEL_CELL_JSON: cell_json(cell),
    }
    if cell.base.digest:
        labels[target.OCI_BASE_DIGEST] = cell.base.digest
    if cell.rehearsal is not None:
        labels[target.LABEL_REHEARSAL] = describe(cell.rehearsal, python=cell.python,
                                                  platform=cell.platform)
    return labels


def image_info(req: RenderRequest) -> dict[str, Any]:
    """What the image knows about itself (read by verify/ inside the container)."""
    cell, lock = req.cell, req.lock
    # A variant's pins are what it installs: stable has no attention layer.
    groups = {*layer_groups(cell, req.variant), "base"}
    pins = {w.name: w.version for w in lock.wheels if w.group in groups} if lock else {
        **dict(cell.stack), "torch": torch_version(cell)
    }
    info: dict[str, Any] = {
        "schema": 1,
        "cell": cell.id,
        "variant": req.variant,
        "platform": cell.platform,
        # The DTK/ROCm/CUDA release the cell targets: verify L0.dtk_env reads it in paths.
        "platform_version": cell.platform_version,
        # What verify/ needs to know about the platform (its backend, collective, how
        # devices are passed), from its PlatformSpec: verify/ names no platform itself.
        "platform_facts": cell.spec.image_facts(),
        "arch": list(cell.arch),
        "lock_digest": lock.digest if lock else "unlocked",
        "torch": torch_version(cell),
        "numpy": cell.numpy,
        "pins": dict(sorted(pins.items())),
        "bitsandbytes": cell.bitsandbytes,
        "env_script": cell.env_script,
        "attention": attention_module(cell, req.variant),
        "imports": declared_imports(cell, req.variant, pins),
        # The vendor boundary, checked by the build guard and by verify L0 in the image.
        "provided": {name: {"version": p.version, "by": p.by}
                     for name, p in effective_provided(cell).items()
                     if p.by == "base-image" or _installs(cell, req.variant, name)},
        "excluded": dict(sorted(cell.excluded.items())),
        "dropped": [{"of": d.of, "requirement": d.requirement, "reason": d.reason}
                    for d in cell.dropped],
        "service": service_info(cell.service, req.variant) if cell.service else None,
    }
    if cell.rehearsal is not None:
        # Reports copy image.json whole: the grid reads the kind of run from it.
        info["run_kind"] = RUN_KIND
        info["rehearsal"] = {"of": cell.rehearsal.of, "of_python": cell.rehearsal.of_python,
                             "content": cell.rehearsal.content}
    return info


# Distributions whose import is the first real test of an image (their wheels carry native
# code or patch others at import), by the module each is imported as.
_IMPORTED = (("torch", "torch"), ("triton", "triton"), ("bitsandbytes", "bitsandbytes"),
             ("unsloth", "unsloth"))


def declared_imports(cell: Cell, variant: Variant, pins: Mapping[str, str]) -> list[str]:
    """The modules verify L0 imports in the image: what it installs of the above, and the
    variant's attention package."""
    modules = [module for dist, module in _IMPORTED if dist in pins]
    if cell.uses_attention(variant):
        modules.append(attention_module(cell, variant))
    return modules


def _installs(cell: Cell, variant: Variant, dist: str) -> bool:
    """Whether this variant installs the vendor wheel of ``dist`` (attention: enhanced only)."""
    wheels = cell.wheels_for(variant)
    return any(canonicalize_name(w.filename.split("-")[0]) == canonicalize_name(dist)
               for w in wheels)


HEALTHCHECK_PATH = "/opt/stackpin/healthcheck.py"
ENTRYPOINT = "/opt/stackpin/entrypoint.sh"


def service_info(service: Service, variant: Variant) -> dict[str, Any]:
    """What every consumer of a variant's service reads: image, start.sh, serve, verify L8."""
    endpoint = service.endpoint(variant)
    inner_url = f"http://127.0.0.1:{service.container_port}{service.health_path}"
    return {
        "argv": list(service.argv(variant)),
        "container_port": service.container_port,
        "host_port": endpoint.port,
        "tools": endpoint.tools,
        "health_path": service.health_path,
        # Through the entrypoint, so the check runs in the environment the service runs in
        # (the cell's env script sourced).
        "health_argv": [ENTRYPOINT, "python", HEALTHCHECK_PATH, inner_url],
        "ready_timeout": service.ready_timeout,
        "state_dir": service.state_dir,
        "models_dir": service.models_dir,
        "password_file": service.bootstrap_password(),
        "env": service.environment(),
    }


def runtime_env(cell: Cell) -> list[tuple[str, str]]:
    """The image's ENV beyond PATH: the cell's env, then its service's (offline switches)."""
    merged = dict(cell.env)
    if cell.service is not None:
        merged.update(cell.service.environment())
    return sorted(merged.items())


def layer_groups(cell: Cell, variant: Variant) -> tuple[Group, ...]:
    wanted: list[Group] = [g for g in GROUPS if g != "attention"]
    if cell.uses_attention(variant):
        wanted.append("attention")
    return tuple(wanted)


def requirements_text(layer: InstallLayer) -> str:
    lines = [f"# stackpin lock, layer '{layer.name}': pip install --no-deps --require-hashes"]
    lines += [f"{w.name}=={w.version} --hash=sha256:{w.sha256}" for w in layer.wheels]
    return "\n".join(lines) + "\n"


def _environment(sources: Sources) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.DictLoader(dict(sources.templates)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["shquote"] = shlex.quote
    env.filters["dockerquote"] = dockerfile_quote
    return env


def dockerfile_quote(value: str) -> str:
    """A double-quoted Dockerfile word: backslash, quote and $ escaped (no env expansion)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


# The BuildKit Dockerfile's first step (``ADD mount-stubs.tar /``) lays down every
# bind-mount target of its steps and the files the engine mounts into /etc, with fixed
# headers (a tar: ADD sets the folders' times too, COPY leaves those of existing ones at the
# time of the run). Where the engine had to make them itself, Engine 20.10's BuildKit left
# /etc and each target folder stamped with the time of the run in the step's layer
# (docs/reproducibility.md, "Mount targets laid down first").
STUBS_TAR = "mount-stubs.tar"
_STUB_FOLDERS = {"etc": 0o755, "opt": 0o755, "tmp": 0o1777, "tmp/context": 0o755,
                 "tmp/context/stackpin": 0o755, "tmp/context/verify": 0o755,
                 "tmp/wheelhouse": 0o755, TOOLS_MOUNT.lstrip("/"): 0o755}
# hosts has a line so the step's layer has a size: the daemon's history tells a step that
# made a layer by its size (stackpin.normalize_record).
_STUB_FILES = {"etc/hostname": "", "etc/hosts": "127.0.0.1\tlocalhost\n", "etc/resolv.conf": ""}


def stub_layer_names(cell: Cell, lock: Lock | None) -> tuple[str, ...]:
    """The install layers of every variant of the cell, whose wheel folders the stubs tar
    lays down. One tar for all variants: the first step's layer must be the same in each,
    or the enhanced image shares nothing above the base with the stable one (a stable-only
    tar made CI build two whole CUDA images and run out of disk)."""
    return tuple(sorted({layer.name for variant in cell.variants
                         for layer in install_layers(cell, variant, lock)}))


def mount_stub_folders(layer_names: Iterable[str]) -> dict[str, int]:
    """The folders of the stubs tar by path (no leading /) and mode. Empty in the image: a
    mount hides them while a step runs, and nothing under /tmp is written in them."""
    return {**_STUB_FOLDERS, **{f"tmp/wheelhouse/{name}": 0o755 for name in layer_names}}


def mount_stubs(layer_names: Iterable[str], *, source_date_epoch: int) -> str:
    """The stubs tar (ustar, ASCII only, so it travels as text like every rendered file)."""
    folders = mount_stub_folders(layer_names)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted({*folders, *_STUB_FILES}):
            info = tarfile.TarInfo(name)
            info.mtime, info.uname, info.gname = source_date_epoch, "", ""
            data = _STUB_FILES.get(name, "").encode()
            if name in folders:
                info.type, info.mode = tarfile.DIRTYPE, folders[name]
            else:
                info.mode, info.size = 0o644, len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue().decode("ascii")


# What ensurepip puts in the venv. The venv step removes those the lock pins, so the
# install step that brings the pinned one deletes nothing of a lower layer: a deletion is
# a whiteout, which Engine 20.10's BuildKit stamps with the time of the run (two cold
# builds of the CPU image differed only there, setuptools 66.1.1's two whiteouts).
ENSUREPIP = ("pip", "setuptools")


def venv_replaced(layers: tuple[InstallLayer, ...]) -> list[str]:
    """ensurepip's distributions that an install layer installs again (pinned)."""
    installed = {canonicalize_name(w.name) for layer in layers for w in layer.wheels}
    return [name for name in ENSUREPIP if name in installed]


def render(req: RenderRequest) -> Rendered:
    """Render the build context text for one cell x variant."""
    cell, variant, lock = req.cell, req.variant, req.lock
    if variant not in cell.variants:
        msg = f"cell '{cell.id}' builds {', '.join(cell.variants)}, not '{variant}'"
        raise ConfigurationError(msg + f"; use --variant {cell.variants[0]}")
    env = _environment(req.sources)
    layers = install_layers(cell, variant, lock)
    labels = image_labels(req)
    context = template_context(req, layers, labels)
    files = {
        "Dockerfile": env.get_template(DOCKERFILES[req.builder]).render(context),
        "stackpin/entrypoint.sh": env.get_template("entrypoint.sh.j2").render(context),
        "stackpin/guard.py": req.sources.text("guard.py"),
        # Each install step byte-compiles what it installed (both builders; never in the image).
        "tools/compile.py": req.sources.text("compile.py"),
        "stackpin/image.json": pretty_json(image_info(req)),
    }
    files.update(compat_files(cell.compat, python_tag=cell.python, sources=req.sources.templates))
    if req.builder == "buildkit":  # each step's clamp, from the tools stage (never in the image)
        files["tools/clamp.py"] = req.sources.text("clamp.py")
        files[STUBS_TAR] = mount_stubs(stub_layer_names(cell, lock),
                                       source_date_epoch=cell.source_date_epoch)
    if cell.env_script:
        files["stackpin/env.sh"] = env.get_template("env.sh.j2").render(context)
    if cell.service is not None:
        files["stackpin/serve.py"] = req.sources.text("serve.py")
        # One health rule for the image's HEALTHCHECK and `stackpin serve`: that module.
        files["stackpin/healthcheck.py"] = req.sources.healthcheck
    for layer in layers:
        files[f"wheels/{layer.name}/requirements.txt"] = requirements_text(layer)
    return Rendered(files=files, labels=labels, base_reference=context["base_reference"])


def template_context(
    req: RenderRequest, layers: tuple[InstallLayer, ...], labels: Mapping[str, str]
) -> dict[str, Any]:
    """Every name the templates and their fragments use."""
    cell, variant, lock = req.cell, req.variant, req.lock
    return {
        "cell": cell,
        "variant": variant,
        "stackpin_version": req.stackpin_version,
        "lock_line": _lock_line(lock),
        "base_reference": base_reference(cell),
        "prefix": f"source {shlex.quote(cell.env_script)} && " if cell.env_script else "",
        "env_script": cell.env_script,
        # BuildKit's Dockerfile is one stage: nothing can be copied from an install stage.
        "one_stage": req.builder == "buildkit",
        "layers": [{"group": x.name, "title": x.title, "why": x.why} for x in layers],
        "torch_version": torch_version(cell),
        "installer": req.installer,
        # BuildKit: the tools stage's folder (clamp, uv), mounted into every step, and the
        # clamp that ends each step; classic: uv unpacked into the install stage's /tmp.
        "tools": TOOLS_MOUNT,
        "uv_dir": TOOLS_MOUNT if req.builder == "buildkit" else "/tmp/uv",
        "venv_replaced": venv_replaced(layers),
        "clamp": f'&& python3 {TOOLS_MOUNT}/clamp.py {cell.source_date_epoch} "$t0"',
        "attention": attention_module(cell, variant),
        "runtime_env": runtime_env(cell),
        "service": service_info(cell.service, variant) if cell.service else None,
        "labels": sorted(labels.items()),
    }


def render_template(sources: Sources, name: str, context: Mapping[str, Any]) -> str:
    """One template or fragment (templates/fragments/*.j2) with the render environment."""
    return _environment(sources).get_template(name).render(context)


def _lock_line(lock: Lock | None) -> str:
    if lock is None:
        return "none yet (run `stackpin wheels fetch`); a build refuses an unlocked cell"
    return f"{lock.digest} ({len(lock.wheels)} wheels)"
