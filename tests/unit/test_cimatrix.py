"""`stackpin ci matrix`: golden outputs per CI format, filtering, exclusion reasons, HCL shape."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from tests.conftest import CPU_CELL, K100_CELL, ROOT
from tests.golden_files import assert_golden
from tests.synthetic import synthetic_cells
from tests.tools import need_docker_plugin, need_module, need_tool

from stackpin import cimatrix
from stackpin.cli.main import cli
from stackpin.errors import ConfigurationError
from stackpin.matrix import Cell

GOLDEN_FILES = {
    "github": "github-matrix.json",
    "gitlab": "gitlab-parallel-matrix.yml",
    "bake": "docker-bake.hcl",
    "json": "matrix.json",
}
STACKPIN = [sys.executable, "-m", "stackpin.cli.main"]


def _declared(cells: dict[str, Cell]) -> set[tuple[str, str]]:
    return {(c.id, v) for c in cells.values() for v in c.variants}


def _plan(cells: dict[str, Cell], **selection: tuple[str, ...]) -> cimatrix.Plan:
    return cimatrix.plan(cells, cimatrix.Selection(**selection))


# --- golden outputs ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(GOLDEN_FILES))
def test_golden_output_per_format(fmt):
    # Synthetic cells and no lock digests: goldens must not change whenever a shipped
    # matrix bumps a pin or a lock is regenerated.
    text = cimatrix.render(_plan(synthetic_cells()), fmt, lock_digests={})
    assert_golden(f"ci/{GOLDEN_FILES[fmt]}", text)


def test_output_is_byte_stable_and_independent_of_cell_order(shipped_cells):
    reversed_cells = dict(reversed(list(shipped_cells.items())))
    for fmt in cimatrix.FORMATS:
        first = cimatrix.render(_plan(shipped_cells), fmt)
        assert first == cimatrix.render(_plan(reversed_cells), fmt)


def test_every_declared_cell_variant_is_a_job_by_default(shipped_cells):
    result = _plan(shipped_cells)
    assert {(j.cell, j.variant) for j in result.jobs} == _declared(shipped_cells)
    assert result.excluded == ()
    # Only variants a cell declares: the CPU and ROCm cells have no enhanced job.
    assert (CPU_CELL, "enhanced") not in {(j.cell, j.variant) for j in result.jobs}


# --- GitHub --------------------------------------------------------------------------


def _run_jq(text: str, expr: str) -> str:
    jq = need_tool("jq")
    done = subprocess.run([jq, "-e", expr], input=text, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("kinds", ["cpu,cuda,dtk,rocm", "cpu,dtk", "cpu"])
def test_github_output_through_jq_lists_every_cell_variant_or_its_reason(shipped_cells, kinds):
    done = subprocess.run(
        [*STACKPIN, "ci", "matrix", "--format", "github", "--runner-kinds", kinds],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    include = json.loads(_run_jq(done.stdout, ".include"))
    reasons = json.loads(_run_jq(done.stdout, ".exclude_reasons"))
    listed = {(e["cell"], e["variant"]) for e in include}
    excluded = {(e["cell"], e["variant"]) for e in reasons}
    assert listed | excluded == _declared(shipped_cells)
    assert not listed & excluded
    assert all(e["reason"] for e in reasons)
    assert {e["platform"] for e in include} <= set(kinds.split(","))


def test_github_include_entries_are_valid_matrix_rows(shipped_cells):
    data = json.loads(cimatrix.render_github(_plan(shipped_cells)))
    for entry in data["include"]:
        assert set(entry) == {"cell", "variant", "platform", "arch", "python", "runs-on"}
        if entry["platform"] == "cpu":
            assert entry["runs-on"] == "ubuntu-latest"
        else:
            # A runner must carry the platform and the ISA the kernels are compiled for.
            assert entry["runs-on"] == ["self-hosted", entry["platform"], entry["arch"]]
    k100 = [e for e in data["include"] if e["cell"] == K100_CELL]
    assert [e["variant"] for e in k100] == ["stable", "enhanced"]
    assert k100[0]["runs-on"] == ["self-hosted", "dtk", "gfx928"]


# --- selection and exclusion reasons -------------------------------------------------


def test_runner_kinds_exclude_cells_with_a_reason_naming_the_runner(shipped_cells):
    result = _plan(shipped_cells, runner_kinds=("cpu", "cuda"))
    excluded = {(e.cell, e.variant): e.reason for e in result.excluded}
    assert {e.platform for e in result.excluded} == {"dtk", "rocm"}
    reason = excluded[(K100_CELL, "enhanced")]
    assert reason.startswith("no dtk runner (--runner-kinds cpu,cuda)")
    assert "self-hosted,dtk,gfx928" in reason
    assert {j.platform for j in result.jobs} == {"cpu", "cuda"}


def test_select_glob_and_platform_filter_report_what_they_left_out(shipped_cells):
    result = _plan(shipped_cells, globs=("dtk2604-*",), platforms=("dtk",))
    assert {j.cell for j in result.jobs} == {K100_CELL, "dtk2604-bw-torch2100-py310"}
    reasons = {e.cell: e.reason for e in result.excluded}
    assert reasons[CPU_CELL] == "not selected by --select dtk2604-*"
    assert reasons["dtk2404-torch210-py310"] == "not selected by --select dtk2604-*"
    by_platform = _plan(shipped_cells, platforms=("cuda",))
    reasons = {e.cell: e.reason for e in by_platform.excluded}
    assert reasons[CPU_CELL] == "platform cpu not selected by --platform cuda"
    assert {(j.cell, j.variant) for j in by_platform.jobs} == {
        ("cuda130-sm90-torch2110-py311", "stable"),
        ("cuda130-sm90-torch2110-py311", "enhanced"),
    }


def test_select_glob_that_matches_nothing_is_a_configuration_error(shipped_cells):
    with pytest.raises(ConfigurationError, match="--select 'dtk9\\*' matches no cell"):
        _plan(shipped_cells, globs=("dtk9*",))


def test_unknown_runner_kind_is_rejected():
    assert cimatrix.parse_runner_kinds(" dtk, cpu,dtk ") == ("cpu", "dtk")
    with pytest.raises(ConfigurationError, match="unknown runner kind 'tpu'"):
        cimatrix.parse_runner_kinds("cpu,tpu")


def test_cli_explain_prints_exclusions_on_stderr_and_text_formats_keep_them_as_comments():
    runner = CliRunner()
    result = runner.invoke(
        cli, ["ci", "matrix", "--format", "gitlab", "--runner-kinds", "cpu", "--explain"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("1 job(s), 8 excluded\n")
    assert f"excluded {K100_CELL} enhanced: no dtk runner" in result.stderr
    assert f"# excluded {K100_CELL} enhanced: no dtk runner" in result.stdout
    assert "excluded" not in runner.invoke(cli, ["ci", "matrix", "--format", "gitlab"]).stderr


def test_cli_errors_exit_with_the_configuration_code():
    runner = CliRunner()
    for args in (["--select", "nope*"], ["--runner-kinds", "gpu"], ["--format", "jenkins"]):
        result = runner.invoke(cli, ["ci", "matrix", *args])
        assert result.exit_code in (2, 3), result.output  # 2: click usage error
    assert runner.invoke(cli, ["ci", "matrix", "--select", "nope*"]).exit_code == 3


# --- GitLab --------------------------------------------------------------------------


def test_gitlab_block_parses_as_parallel_matrix_of_strings(shipped_cells):
    yaml = need_module("yaml")
    text = cimatrix.render_gitlab(_plan(shipped_cells, runner_kinds=("cpu", "dtk")))
    data = yaml.safe_load(text)
    entries = data["parallel"]["matrix"]
    # GitLab wants string values; "26.04"-like values must not turn into numbers.
    assert all(isinstance(v, str) for e in entries for v in e.values())
    assert {(e["CELL"], e["VARIANT"]) for e in entries} == {
        (c, v) for c, v in _declared(shipped_cells) if shipped_cells[c].platform in ("cpu", "dtk")
    }
    assert len(entries) <= 200  # GitLab's limit of jobs per parallel:matrix


# --- bake (HCL): a structural check of the subset we emit ----------------------------

# Attributes of a bake target (docker/buildx docs/bake-reference.md); `network` is in
# the current reference (default|host|none).
BAKE_TARGET_ATTRIBUTES = {
    "args", "annotations", "attest", "cache-from", "cache-to", "call", "context", "contexts",
    "dockerfile", "dockerfile-inline", "entitlements", "inherits", "labels", "matrix", "name",
    "network", "no-cache", "no-cache-filter", "output", "platforms", "pull", "secret",
    "shm-size", "ssh", "tags", "target", "ulimits",
}
_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|("(?:[^"\\]|\\.)*")|([A-Za-z_][A-Za-z0-9_-]*)|(\S))')


def _tokens(text: str) -> list[str]:
    out = []
    pos = 0
    while text[pos:].strip():
        match = _TOKEN.match(text, pos)
        assert match, f"cannot tokenise HCL at {text[pos:pos + 30]!r}"
        pos = match.end()
        if match.group(1) is None and match.group(0).strip():
            out.append(match.group(0).strip())
    return out


def _value(tokens: list[str]):
    tok = tokens.pop(0)
    if tok.startswith('"'):
        return json.loads(tok.replace("$${", "${").replace("%%{", "%{"))
    if tok == "[":
        items = []
        while tokens[0] != "]":
            items.append(_value(tokens))
            if tokens[0] == ",":
                tokens.pop(0)
        tokens.pop(0)
        return items
    if tok == "{":
        mapping = {}
        while tokens[0] != "}":
            key = _value(tokens)
            assert tokens.pop(0) == "="
            mapping[key] = _value(tokens)
        tokens.pop(0)
        return mapping
    msg = f"unexpected HCL token {tok!r}"
    raise AssertionError(msg)


def parse_bake_hcl(text: str) -> dict:
    """The subset of HCL we emit (blocks with one label, string/list/map attributes),
    parsed into the same shape as `docker buildx bake --print` JSON."""
    tokens = _tokens(text)
    out: dict = {}
    while tokens:
        kind, label = tokens.pop(0), json.loads(tokens.pop(0))
        assert kind in ("group", "target"), kind
        assert tokens.pop(0) == "{"
        body: dict = {}
        while tokens[0] != "}":
            key = tokens.pop(0)
            assert tokens.pop(0) == "=", key
            assert key not in body, f"duplicate attribute {key}"
            body[key] = _value(tokens)
        tokens.pop(0)
        assert label not in out.setdefault(kind, {}), f"duplicate {kind} {label}"
        out[kind][label] = body
    return out


def test_bake_file_structure(shipped_cells):
    text = cimatrix.render_bake(_plan(shipped_cells), lock_digests={})
    bake = parse_bake_hcl(text)
    targets = bake["target"]
    assert bake["group"] == {"default": {"targets": list(targets)}}
    assert {(t["labels"]["io.stackpin.cell"], t["labels"]["io.stackpin.variant"])
            for t in targets.values()} == _declared(shipped_cells)
    for name, target in targets.items():
        assert re.fullmatch(r"[a-zA-Z0-9_-]+", name)  # buildx's targetNamePattern
        assert set(target) <= BAKE_TARGET_ATTRIBUTES
        cell, variant = target["labels"]["io.stackpin.cell"], target["labels"]["io.stackpin.variant"]
        assert target["context"] == f"build/context/{cell}-{variant}"
        assert target["dockerfile"] == "Dockerfile"
        assert target["tags"] == [f"stackpin/{cell}:{variant}"]
        assert target["network"] in ("default", "host", "none")
        assert target["platforms"] == ["linux/amd64"]
        epoch = shipped_cells[cell].source_date_epoch
        assert target["args"] == {"SOURCE_DATE_EPOCH": str(epoch)}


def test_bake_adds_the_lock_digest_tag_and_label():
    digest = "28853bc08e5ebadfc498f439aaf1c95978fda304b3ae241617280797a34732b5"
    from stackpin.matrixfile import load_cells

    cells = load_cells(sorted((ROOT / "pinning").glob("*.toml")))
    result = _plan(cells, globs=(CPU_CELL,))
    target = parse_bake_hcl(cimatrix.render_bake(result, lock_digests={CPU_CELL: digest}))[
        "target"
    ][f"{CPU_CELL}-stable"]
    # The one tag order of stackpin.target: the lock-digest tag first, as `stackpin build` tags.
    assert target["tags"] == [f"stackpin/{CPU_CELL}:stable-28853bc08e5e", f"stackpin/{CPU_CELL}:stable"]
    assert target["labels"]["io.stackpin.lock-digest"] == digest


def test_hcl_strings_never_interpolate_and_names_are_bake_safe():
    assert cimatrix.hcl_str('a"${X}%{if}\\') == '"a\\"$${X}%%{if}\\\\"'
    assert parse_bake_hcl('target "x" {\n  tags = [' + cimatrix.hcl_str("${X}") + "]\n}\n") == {
        "target": {"x": {"tags": ["${X}"]}}
    }
    assert cimatrix.bake_target_name("cuda12.8-sm90", "stable") == "cuda12_8-sm90-stable"


def test_bake_file_passes_buildx_print_where_buildx_exists(shipped_cells, tmp_path):
    docker = need_docker_plugin("buildx")
    bake_file = tmp_path / "docker-bake.hcl"
    bake_file.write_text(cimatrix.render_bake(_plan(shipped_cells), lock_digests={}))
    done = subprocess.run(
        [docker, "buildx", "bake", "-f", str(bake_file), "--print"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["target"].keys() == parse_bake_hcl(bake_file.read_text())[
        "target"
    ].keys()


def test_sample_workflow_consumes_the_github_output():
    workflow = (ROOT / "docs" / "ci" / "github-workflow.yml").read_text(encoding="utf-8")
    yaml = need_module("yaml")
    data = yaml.safe_load(workflow)
    jobs = data["jobs"]
    assert "stackpin ci matrix --format github" in workflow
    verify = next(j for j in jobs.values() if "strategy" in j)
    assert "fromJSON" in str(verify["strategy"]["matrix"])
    steps = " ".join(str(s.get("run", "")) + str(s.get("uses", "")) for s in verify["steps"])
    for needle in ("stackpin render", "stackpin wheels fetch", "stackpin build",
                   "stackpin verify", "actions/upload-artifact"):
        assert needle in steps, needle
    assert any("stackpin report grid" in str(j) for j in jobs.values())



def test_cli_tags_bake_targets_with_the_current_lock_digest(shipped_cells):
    from stackpin.lock import read_lock, stale_reason

    result = CliRunner().invoke(cli, ["ci", "matrix", "--format", "bake", "--select", CPU_CELL])
    assert result.exit_code == 0, result.output
    target = parse_bake_hcl(result.stdout)["target"][f"{CPU_CELL}-stable"]
    lock = read_lock(ROOT, CPU_CELL)
    if lock is None or stale_reason(lock, shipped_cells[CPU_CELL]) is not None:
        # A stale lock would not build, so no digest tag may point at it.
        assert target["tags"] == [f"stackpin/{CPU_CELL}:stable"]
    else:
        assert target["tags"][0] == f"stackpin/{CPU_CELL}:stable-{lock.digest[:12]}"
