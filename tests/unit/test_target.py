"""One resolved target per verb: one cell load, one lock check, one exit code per lock error."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.conftest import CPU_CELL, ROOT

from stackpin import matrixfile as matrix_module
from stackpin.cli.main import cli
from stackpin.errors import LockMissingError, LockStaleError
from stackpin.lock import Lock, read_lock
from stackpin.target import Layout, image_tags, load_cell, resolve


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the matrices, locks and templates; the verbs run in it, never in the checkout."""
    for folder in ("pinning", "templates"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _edit_cpu_description(project: Path) -> None:
    path = project / "pinning" / "cpu.toml"
    text = path.read_text(encoding="utf-8")
    edited = text.replace('description = "CPU reference:', 'description = "Edited:', 1)
    assert edited != text
    path.write_text(edited, encoding="utf-8")


# The verbs that need a current lock, each with what it says when the lock is stale.
LOCKED_VERBS = [
    ("build", CPU_CELL),
    ("build", CPU_CELL, "--prepare-only"),
    ("rebuild", "--check", CPU_CELL),
    ("verify", CPU_CELL),
    ("bundle", "export", CPU_CELL, "-o", "out"),
    ("wheels", "verify", CPU_CELL),
]


@pytest.mark.parametrize("args", [*LOCKED_VERBS, ("render", CPU_CELL)])
def test_stale_lock_is_exit_4_with_one_message_in_every_verb(project: Path, args):
    _edit_cpu_description(project)
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == LockStaleError.return_code == 4, result.output
    assert f"{CPU_CELL}: lock is stale (the cell changed since the lock was written)" in (
        result.output
    )
    assert not (project / "out").exists()


@pytest.mark.parametrize("args", LOCKED_VERBS)
def test_missing_lock_is_exit_4_with_one_message_in_every_verb(project: Path, args):
    (project / "pinning" / "locks" / f"{CPU_CELL}.lock").unlink()
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == LockMissingError.return_code == 4, result.output
    assert f"{CPU_CELL} has no lock: run 'stackpin wheels fetch {CPU_CELL}' first" in (
        result.output
    )


def test_render_without_a_lock_still_renders(project: Path):
    (project / "pinning" / "locks" / f"{CPU_CELL}.lock").unlink()
    result = CliRunner().invoke(cli, ["render", CPU_CELL])
    assert result.exit_code == 0, result.output
    assert "none yet (run `stackpin wheels fetch`)" in result.output


def test_a_broken_unrelated_matrix_does_not_stop_a_verb(project: Path):
    # Only the matrix holding the cell is decoded; before, every verb decoded all four.
    (project / "pinning" / "dtk.toml").write_text("schema_version = 1\n[cells.x]\nbogus = 1\n")
    result = CliRunner().invoke(cli, ["render", CPU_CELL])
    assert result.exit_code == 0, result.output


def test_load_cell_decodes_one_matrix(project: Path, monkeypatch: pytest.MonkeyPatch):
    decoded: list[str] = []
    real = matrix_module.decode_matrix

    def counting(data, *, source: str):  # type: ignore[no-untyped-def]
        decoded.append(Path(source).name)
        return real(data, source=source)

    monkeypatch.setattr("stackpin.target.decode_matrix", counting)
    assert load_cell(Layout(project), CPU_CELL).id == CPU_CELL
    assert decoded == ["cpu.toml"]


def test_unknown_cell_still_suggests_the_closest(project: Path):
    result = CliRunner().invoke(cli, ["build", "cpu-bookworm-torch2130-py312"])
    assert result.exit_code == 3
    assert "perhaps you meant 'cpu-bookworm-torch2130-py311'" in result.output


def test_cell_in_two_matrices_is_refused(project: Path):
    shutil.copy(project / "pinning" / "cpu.toml", project / "pinning" / "cpu-copy.toml")
    result = CliRunner().invoke(cli, ["render", CPU_CELL])
    assert result.exit_code == 3
    assert f"cell '{CPU_CELL}' is in both" in result.output


def test_lock_digest_is_computed_once(monkeypatch: pytest.MonkeyPatch):
    lock = read_lock(ROOT, CPU_CELL)
    assert lock is not None
    calls: list[int] = []
    real_text = Lock.text

    def counting(self: Lock) -> str:
        calls.append(1)
        return real_text(self)

    monkeypatch.setattr(Lock, "text", counting)
    first = lock.digest
    assert [lock.digest for _ in range(5)] == [first] * 5
    assert len(calls) == 1


def test_resolve_gives_one_target_per_variant_sharing_one_lock(project: Path):
    targets = resolve(Layout(project), CPU_CELL, "all")
    assert [t.variant for t in targets] == ["stable"]
    (target,) = targets
    assert target.tags == image_tags(CPU_CELL, "stable", target.lock.digest)
    assert target.context_dir == project / "build" / "context" / f"{CPU_CELL}-stable"
    assert target.record_path == project / "build" / "records" / f"{CPU_CELL}-stable.json"
    assert target.report_dir == project / "build" / "reports" / f"{CPU_CELL}-stable"
    assert target.log_path == project / "build" / "logs" / f"{CPU_CELL}-stable.log"


def test_image_tags_digest_first_then_moving():
    assert image_tags("c", "stable", "ab" * 32) == ("stackpin/c:stable-" + "ab" * 6,
                                                   "stackpin/c:stable")
    assert image_tags("c", "stable", "sha256:" + "cd" * 32)[0] == "stackpin/c:stable-" + "cd" * 6
    # Unlocked (a CI matrix before the first fetch): only the moving tag.
    assert image_tags("c", "enhanced", "") == ("stackpin/c:enhanced",)


def test_the_build_labels_the_dockerfile_and_context_it_was_made_from(project: Path):
    import hashlib

    from stackpin.build import plan

    (target,) = resolve(Layout(project), CPU_CELL, "stable")
    shutil.copytree(ROOT / "verify", project / "verify")
    first = plan(target, no_cache=False, provenance={})
    labels = first.request.labels
    assert labels["io.stackpin.dockerfile-sha256"] == hashlib.sha256(
        first.rendered.dockerfile.encode()).hexdigest()
    # Any context file counts: an edit in verify/ moves the context digest, not the Dockerfile's.
    (project / "verify" / "extra.txt").write_text("x")
    second = plan(target, no_cache=False, provenance={}).request.labels
    assert second["io.stackpin.dockerfile-sha256"] == labels["io.stackpin.dockerfile-sha256"]
    assert second["io.stackpin.context-digest"] != labels["io.stackpin.context-digest"]


def test_the_attention_rule_has_one_home_on_the_cell():
    from tests.synthetic import synthetic_cells

    cells = synthetic_cells()
    dtk, cpu = cells["synth-dtk"], cells["synth-cpu"]
    assert dtk.uses_attention("enhanced") and not dtk.uses_attention("stable")
    assert dtk.locks_attention
    assert not cpu.uses_attention("enhanced") and not cpu.locks_attention
    only_stable = dataclasses.replace(dtk, variants=("stable",))
    assert not only_stable.locks_attention  # its attention wheel is neither locked nor built
    assert dtk.attention is not None
    assert dtk.wheels_for("enhanced")[-1] == dtk.attention
    assert dtk.attention not in dtk.wheels_for("stable")
