"""Fan the ABI matrix out to CI engines: GitHub Actions, GitLab CI and BuildKit bake.

stackpin does not schedule CI work itself: one machine cannot build and verify every
cell (each needs its own accelerator), so this module only turns cells into the
matrix formats the engines already run. Pure: cells and options in, text out; the
same input gives the same bytes. Nothing is dropped silently: every shipped
cell x variant is either a job or an exclusion with its reason.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stackpin import platforms
from stackpin.errors import ConfigurationError
from stackpin.matrix import VARIANTS, Cell, Platform, Variant
from stackpin.target import LABEL_CELL, LABEL_LOCK_DIGEST, LABEL_VARIANT, Layout, image_tags

PLATFORMS: tuple[Platform, ...] = tuple(sorted(platforms.names()))
FORMATS = ("github", "gitlab", "bake", "json")
JSON_SCHEMA = "stackpin.ci-matrix/v1"

# Docker's GOARCH names for the cell's cpu_arch, for bake's `platforms`.
_OCI_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
# buildx rejects target names outside [a-zA-Z0-9_-] (bake.go targetNamePattern).
_BAKE_NAME_BAD = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(frozen=True, kw_only=True)
class Selection:
    """What the user asked for; an empty tuple means 'no filter'."""

    globs: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    runner_kinds: tuple[str, ...] = PLATFORMS


@dataclass(frozen=True, kw_only=True)
class Job:
    """One CI job: a cell x variant verified on one accelerator arch."""

    cell: str
    variant: Variant
    platform: Platform
    platform_version: str
    arch: str
    cpu_arch: str
    python: str
    runs_on: str | tuple[str, ...]
    source_date_epoch: int


@dataclass(frozen=True, kw_only=True)
class Exclusion:
    """A cell x variant that is not a job, and why."""

    cell: str
    variant: Variant
    platform: Platform
    reason: str


@dataclass(frozen=True, kw_only=True)
class Plan:
    jobs: tuple[Job, ...]
    excluded: tuple[Exclusion, ...]


def parse_runner_kinds(text: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b') for platform names; an unknown kind is a configuration error."""
    kinds = tuple(sorted({k.strip() for k in text.split(",") if k.strip()}))
    for kind in kinds:
        if kind not in PLATFORMS:
            msg = f"unknown runner kind '{kind}' in --runner-kinds; use {','.join(PLATFORMS)}"
            raise ConfigurationError(msg)
    return kinds


def plan(cells: Mapping[str, Cell], selection: Selection) -> Plan:
    """Every declared cell x variant, sorted, split into jobs and exclusions."""
    _check_globs(cells, selection.globs)
    jobs: list[Job] = []
    excluded: list[Exclusion] = []
    for cell_id in sorted(cells):
        cell = cells[cell_id]
        reason = _exclusion_reason(cell, selection)
        for variant in _declared_variants(cell):
            if reason:
                excluded.append(
                    Exclusion(cell=cell.id, variant=variant, platform=cell.platform, reason=reason)
                )
            else:
                jobs += _jobs_for(cell, variant)
    return Plan(jobs=tuple(jobs), excluded=tuple(excluded))


def _check_globs(cells: Mapping[str, Cell], globs: Sequence[str]) -> None:
    # A glob that matches nothing is almost always a typo; failing beats an empty CI run.
    for glob in globs:
        if not fnmatch.filter(cells, glob):
            msg = f"--select '{glob}' matches no cell; 'stackpin matrix list' shows the ids"
            raise ConfigurationError(msg)


def _declared_variants(cell: Cell) -> list[Variant]:
    return [v for v in VARIANTS if v in cell.variants]


def _exclusion_reason(cell: Cell, selection: Selection) -> str:
    if selection.globs and not any(fnmatch.fnmatchcase(cell.id, g) for g in selection.globs):
        return f"not selected by --select {' '.join(selection.globs)}"
    if selection.platforms and cell.platform not in selection.platforms:
        chosen = ",".join(selection.platforms)
        return f"platform {cell.platform} not selected by --platform {chosen}"
    if cell.platform not in selection.runner_kinds:
        labels = ",".join(_runner_labels(cell, _arches(cell)[0]))
        return (
            f"no {cell.platform} runner (--runner-kinds {','.join(selection.runner_kinds)}); "
            f"register a runner labelled {labels} and add {cell.platform} to --runner-kinds"
        )
    return ""


def _arches(cell: Cell) -> tuple[str, ...]:
    # Verification must run the kernels on each ISA the cell claims: some vendor
    # extensions ship for gfx936 but not gfx928 (dcu-facts), so one job per arch.
    return cell.arch or (cell.cpu_arch,)


def _runner_labels(cell: Cell, arch: str) -> tuple[str, ...]:
    return ("self-hosted", cell.platform, arch)


def _jobs_for(cell: Cell, variant: Variant) -> list[Job]:
    return [
        Job(
            cell=cell.id,
            variant=variant,
            platform=cell.platform,
            platform_version=cell.platform_version,
            arch=arch,
            cpu_arch=cell.cpu_arch,
            python=cell.python,
            # CPU cells need no accelerator, so GitHub's hosted runners do.
            runs_on=cell.spec.ci_runner or _runner_labels(cell, arch),
            source_date_epoch=cell.source_date_epoch,
        )
        for arch in _arches(cell)
    ]


# --- image naming shared by every format ---------------------------------------------


def context_dir(cell_id: str, variant: Variant) -> str:
    """Where `stackpin build CELL --variant V --prepare-only` writes the build context."""
    return Layout(Path()).context_dir(cell_id, variant).as_posix()


# --- GitHub Actions ------------------------------------------------------------------


def _exclusions_json(excluded: Iterable[Exclusion]) -> list[dict[str, str]]:
    return [
        {"cell": e.cell, "variant": e.variant, "platform": e.platform, "reason": e.reason}
        for e in excluded
    ]


def _runs_on_json(runs_on: str | tuple[str, ...]) -> str | list[str]:
    return runs_on if isinstance(runs_on, str) else list(runs_on)


def render_github(result: Plan) -> str:
    """strategy.matrix JSON; `exclude_reasons` sits beside `include`, so use `.include`."""
    include = [
        {
            "arch": j.arch,
            "cell": j.cell,
            "platform": j.platform,
            "python": j.python,
            "runs-on": _runs_on_json(j.runs_on),
            "variant": j.variant,
        }
        for j in _sorted_jobs(result.jobs)
    ]
    data = {"include": include, "exclude_reasons": _exclusions_json(result.excluded)}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _sorted_jobs(jobs: Iterable[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: (j.cell, VARIANTS.index(j.variant), j.arch))


# --- plain JSON ----------------------------------------------------------------------


def render_json(result: Plan, *, lock_digests: Mapping[str, str]) -> str:
    """Everything a custom CI driver needs per job, plus the exclusions."""
    jobs = [
        {
            "arch": j.arch,
            "cell": j.cell,
            "context": context_dir(j.cell, j.variant),
            "cpu_arch": j.cpu_arch,
            "dockerfile": "Dockerfile",
            "platform": j.platform,
            "platform_version": j.platform_version,
            "python": j.python,
            "runs_on": _runs_on_json(j.runs_on),
            "tags": list(image_tags(j.cell, j.variant, lock_digests.get(j.cell, ""))),
            "variant": j.variant,
        }
        for j in _sorted_jobs(result.jobs)
    ]
    data = {"schema": JSON_SCHEMA, "jobs": jobs, "excluded": _exclusions_json(result.excluded)}
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


# --- GitLab CI -----------------------------------------------------------------------


def _yaml_str(value: str) -> str:
    # JSON strings are valid YAML double-quoted scalars; quoting everything keeps
    # values such as "26.04" or "on" strings, which GitLab requires for variables.
    return json.dumps(value)


def render_gitlab(result: Plan) -> str:
    """A `parallel:matrix` block; pair it with `tags: ["$PLATFORM", "$ARCH"]`."""
    lines = [
        "# stackpin ci matrix --format gitlab: paste under a job, with",
        '# tags: ["$PLATFORM", "$ARCH"] to pick a runner of the right kind.',
        *_comment_exclusions(result.excluded),
        "parallel:",
        "  matrix:",
    ]
    for job in _sorted_jobs(result.jobs):
        pairs = [
            ("CELL", job.cell),
            ("VARIANT", job.variant),
            ("PLATFORM", job.platform),
            ("ARCH", job.arch),
            ("PYTHON", job.python),
        ]
        lines += [
            f"{'    - ' if i == 0 else '      '}{key}: {_yaml_str(value)}"
            for i, (key, value) in enumerate(pairs)
        ]
    if not result.jobs:
        lines[-1] = "  matrix: []"
    return "\n".join(lines) + "\n"


def _comment_exclusions(excluded: Sequence[Exclusion]) -> list[str]:
    return [f"# excluded {e.cell} {e.variant}: {e.reason}" for e in excluded]


# --- docker buildx bake (HCL) --------------------------------------------------------


def bake_target_name(cell_id: str, variant: Variant) -> str:
    return _BAKE_NAME_BAD.sub("_", f"{cell_id}-{variant}")


def hcl_str(value: str) -> str:
    """An HCL quoted string: JSON escapes, plus `${`/`%{` escaped so nothing interpolates."""
    return json.dumps(value).replace("${", "$${").replace("%{", "%%{")


def _hcl_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(hcl_str(v) for v in values) + "]"


def _hcl_map(name: str, mapping: Mapping[str, str]) -> list[str]:
    width = max(len(hcl_str(k)) for k in mapping)
    body = [f"    {hcl_str(k):<{width}} = {hcl_str(v)}" for k, v in sorted(mapping.items())]
    return [f"  {name} = {{", *body, "  }"]


def _bake_target(
    cell: str, variant: Variant, *, cpu_arch: str, epoch: int, digest: str
) -> list[str]:
    labels = {LABEL_CELL: cell, LABEL_VARIANT: variant}
    if digest:
        labels[LABEL_LOCK_DIGEST] = digest
    lines = [
        f"target {hcl_str(bake_target_name(cell, variant))} {{",
        f"  context    = {hcl_str(context_dir(cell, variant))}",
        f"  dockerfile = {hcl_str('Dockerfile')}",
        f"  tags       = {_hcl_list(image_tags(cell, variant, digest))}",
        f"  platforms  = {_hcl_list([f'linux/{_OCI_ARCH.get(cpu_arch, cpu_arch)}'])}",
        # Builds are offline by design (wheelhouse in the context); bake's target.network
        # accepts default|host|none (buildx bake reference), older buildx lacks it.
        f"  network    = {hcl_str('none')}",
    ]
    if epoch:
        # BuildKit reads the SOURCE_DATE_EPOCH build arg for reproducible timestamps.
        lines += _hcl_map("args", {"SOURCE_DATE_EPOCH": str(epoch)})
    return [*lines, *_hcl_map("labels", labels), "}"]


def render_bake(result: Plan, *, lock_digests: Mapping[str, str]) -> str:
    """docker-bake.hcl: group "default" and one target per cell x variant."""
    seen: dict[str, Job] = {}
    for job in _sorted_jobs(result.jobs):
        seen.setdefault(bake_target_name(job.cell, job.variant), job)  # one image, many arches
    lines = [
        "# stackpin ci matrix --format bake: one target per cell x variant.",
        "# Prepare each context first: stackpin build CELL --variant V --prepare-only",
        *_comment_exclusions(result.excluded),
        "",
        'group "default" {',
        f"  targets = {_hcl_list(seen)}",
        "}",
    ]
    for job in seen.values():
        target = _bake_target(
            job.cell,
            job.variant,
            cpu_arch=job.cpu_arch,
            epoch=job.source_date_epoch,
            digest=lock_digests.get(job.cell, ""),
        )
        lines += ["", *target]
    return "\n".join(lines) + "\n"


# --- front door ----------------------------------------------------------------------


def render(result: Plan, fmt: str, *, lock_digests: Mapping[str, str] | None = None) -> str:
    digests = lock_digests or {}
    if fmt == "github":
        return render_github(result)
    if fmt == "gitlab":
        return render_gitlab(result)
    if fmt == "bake":
        return render_bake(result, lock_digests=digests)
    if fmt == "json":
        return render_json(result, lock_digests=digests)
    msg = f"unknown CI format '{fmt}'; use one of {', '.join(FORMATS)}"
    raise ConfigurationError(msg)


def explain(result: Plan) -> str:
    """Human lines for --explain: what runs and what does not, and why."""
    lines = [f"{len(result.jobs)} job(s), {len(result.excluded)} excluded"]
    lines += [f"excluded {e.cell} {e.variant}: {e.reason}" for e in result.excluded]
    return "\n".join(lines) + "\n"

