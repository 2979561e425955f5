"""The engine matrix's small cell: the CPU default renamed (MATRIX_CELL, its lock rewritten
to match), built from a small synthetic Dockerfile template in a copy of the checkout, for
tests where the engine or the generated files, not torch, are under test."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, stackpin_cli

from stackpin.lock import cell_digest
from stackpin.matrixfile import load_cells
from stackpin.render import DOCKERFILES

MATRIX_CELL = "matrix-bookworm-py311"
EPOCH = 1735689600  # the CPU default's source_date_epoch (2025-01-01), which the cell keeps
# Writes files at build time (their mtimes differ per build: normalisation's job), has the
# venv the SBOM probe runs in, starts through the rendered entrypoint, carries the labels.
# 32 MiB of zeros make its own layer far smaller compressed than unpacked (image sizes).
# BuildKit's build uses the real template's tools stage, build args and venv step (ensurepip's
# pip included: without the SOURCE_DATE_EPOCH arg its pycs and RECORD hold the build's time,
# which this test caught) and the step clamp (a second step, as the real guard step copies
# the build files in and clamps what it wrote): on Docker 28 that is what makes the image
# reproducible as built, so this is what the matrix proves.
SMALL_TEMPLATE = """\
# Engine-matrix image for cell {{ cell.id }}, variant {{ variant }}: small on purpose.
{% if one_stage %}
{% include "fragments/tools-stage.j2" %}

{% endif %}
FROM {{ base_reference }}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
{% if one_stage %}
ADD mount-stubs.tar /
{% include "fragments/build-args.j2" %}
{% include "fragments/venv-step.j2" %}
RUN --mount=type=bind,source=stackpin,target=/tmp/context/stackpin \\
    --mount=type=bind,from=tools,source={{ tools }},target={{ tools }} \\
    t0=$(date +%s%N) && cp -a /tmp/context/stackpin/. /opt/stackpin/ \\
{% else %}
COPY stackpin/ /opt/stackpin/
RUN python3 -m venv --without-pip /opt/stackpin/venv \\
{% endif %}
    && mkdir -p /opt/stackpin/data \\
    && python3 -c 'import sys; print(sys.version.split()[0])' > /opt/stackpin/data/python \\
    && echo {{ cell.id }} > /opt/stackpin/data/cell \\
    && head -c 32M /dev/zero > /opt/stackpin/data/zeros \\
    && chmod 0755 /opt/stackpin/entrypoint.sh{% if one_stage %} \\
    {{ clamp }}{% endif %}

{% include "fragments/labels.j2" %}
ENTRYPOINT ["/opt/stackpin/entrypoint.sh"]
CMD ["cat", "/opt/stackpin/data/cell"]
"""


def _rewrite(path: Path, text: str) -> None:
    path.unlink()  # the copy's files are hard links: never write through them
    path.write_text(text)


def small_project(source: Path, dest: Path, *, cell: str = MATRIX_CELL,
                  template: str = SMALL_TEMPLATE) -> Path:
    """A copy of ``source`` whose CPU cell of cpu.toml is renamed ``cell`` (its lock and
    wheelhouse moved to match), every builder's Dockerfile being ``template``."""
    shutil.copytree(source, dest, symlinks=True, copy_function=os.link,
                    ignore=shutil.ignore_patterns("build"))
    matrix = dest / "pinning" / "cpu.toml"
    _rewrite(matrix, matrix.read_text().replace(CPU_CELL, cell))
    cells = load_cells(sorted((dest / "pinning").glob("*.toml")))
    lock = json.loads((dest / "pinning" / "locks" / f"{CPU_CELL}.lock").read_text())
    lock.update(cell=cell, cell_digest=cell_digest(cells[cell]))
    (dest / "pinning" / "locks" / f"{cell}.lock").write_text(
        json.dumps(lock, indent=2, sort_keys=True) + "\n")
    (dest / "wheels" / CPU_CELL).rename(dest / "wheels" / cell)
    for builder_template in DOCKERFILES.values():  # each builder's Dockerfile
        _rewrite(dest / "templates" / builder_template, template)
    return dest


@pytest.fixture(scope="session")  # shared through tests/integration/conftest.py
def small_checkout(cpu_project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The matrix cell's lock is the CPU default's: link the session copy's wheelhouse,
    # fetched first when missing (as the CPU default's own fixture does).
    if stackpin_cli("wheels", "verify", CPU_CELL, cwd=cpu_project).returncode:
        done = stackpin_cli("wheels", "fetch", CPU_CELL, cwd=cpu_project)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return small_project(cpu_project, tmp_path_factory.mktemp("matrix") / "checkout")
