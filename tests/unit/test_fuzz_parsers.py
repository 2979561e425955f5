"""Fuzz tier: every parser of outside input either succeeds or raises ONE StackpinError
with a one-line message; never another exception, never a traceback.

Hypothesis runs a fixed, derandomized number of examples per parser so CI time stays
small and a failure reproduces; each test also runs its seeds through the CLI where the
parser has a verb, so the top-level handler is fuzzed too.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.test_matrix import MINIMAL

from stackpin import comparison, reports
from stackpin.abi import parse_wheel_filename
from stackpin.bundle import trust
from stackpin.bundle import verify as verifying
from stackpin.checks import check_cells
from stackpin.errors import StackpinError
from stackpin.lock import parse_lock, wheel_name_version
from stackpin.matrixfile import decode_matrix_lenient
from stackpin.untrusted import parse_json
from stackpin.wheelhouse import locked_requirements, vendor_files_needed, verify_wheelhouse

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner,
                                                                 max_size=5),
    max_leaves=30,
)

SHA = "ab" * 32
MANIFEST: dict[str, Any] = {
    "format": "stackpin-bundle", "format_version": 1, "created": "2025-01-01T00:00:00Z",
    "signed_by": None, "sha256sums": SHA,
    "images_archive": {"tar_bytes": 10240},
    "images": [{"cell": "c1", "variant": "stable", "profile": "stable", "id": f"sha256:{SHA}",
                "tags": ["stackpin/c1:stable"], "port": 18888, "platform": "cpu",
                "cpu_arch": "x86_64", "arch": [], "labels": {}, "run": {}, "size": 1}],
    "files": [{"path": "images.tar.zst", "size": 1, "sha256": SHA},
              {"path": "SHA256SUMS", "size": 1, "sha256": SHA}],
}
REPORT: dict[str, Any] = {
    "schema": reports.REPORT_SCHEMA, "created": "2025-01-01T00:00:00Z", "backend": "cpu",
    "host": {"hostname": "h"}, "image": {"cell": "c1", "variant": "stable"},
    "versions": {"torch": "2.13.0"}, "summary": {"required_failed": 0},
    "checks": [{"name": "L1.gemm", "level": 1, "required": True, "status": "pass",
                "reason": "", "duration_s": 0.1, "metrics": {"tflops": 1.5}}],
}


# Values past every bound: numbers beyond Python's 4300-digit int() limit, in an integer
# and inside strings (versions, labels, tags), and strings longer than any setting.
HUGE = (st.integers(4000, 6000).map(lambda n: int("9" * n) if n < 4300 else "9" * n)
        | st.integers(20, 400).map(lambda n: 10 ** n)
        | st.builds(lambda n, head: f"{head}{'9' * n}", st.integers(200, 6000),
                    st.sampled_from(["", "1.", "2.13.0+", "cp", "2.", "<", "manylinux_2_"])))


def _mutations(document: dict[str, Any],
               values: st.SearchStrategy[Any] = JSON) -> st.SearchStrategy[Any]:
    """The document with one value somewhere replaced, or one key removed."""
    def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        found = [prefix]
        if isinstance(value, dict):
            for key, item in value.items():
                found += paths(item, (*prefix, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                found += paths(item, (*prefix, index))
        return found

    def apply(path: tuple[Any, ...], new: Any, remove: bool) -> Any:
        copy = json.loads(json.dumps(document))
        if not path:
            return new
        parent = copy
        for step in path[:-1]:
            parent = parent[step]
        if remove and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = new
        return copy

    return st.builds(apply, st.sampled_from(paths(document)), values, st.booleans())


def _one_line(error: StackpinError) -> None:
    assert error.message
    assert "\n" not in error.message and "\r" not in error.message


def _accepts_or_refuses(parse: Any, *args: Any) -> Any:
    try:
        return parse(*args)
    except StackpinError as exc:
        _one_line(exc)
        return None


# --- bundle manifest --------------------------------------------------------------------


def _manifest(data: bytes) -> Any:
    # The opt-out skips the signature, so the parser and schema see every input.
    return verifying.accept_manifest(Path("b"), data, None, trust.insecure())


@FUZZ
@given(st.binary(max_size=2000))
def test_manifest_bytes(data):
    _accepts_or_refuses(_manifest, data)


@FUZZ
@given(_mutations(MANIFEST))
def test_manifest_shapes(document):
    result = _accepts_or_refuses(_manifest, json.dumps(document).encode())
    if result is not None:  # accepted: every field the code reads has its type
        manifest = result[0]
        assert all(isinstance(e["size"], int) for e in manifest["files"])
        assert all(isinstance(i["tags"][0], str) for i in manifest["images"])


def test_the_unmutated_manifest_is_accepted():
    manifest, state = _manifest(json.dumps(MANIFEST).encode())
    assert state == "not checked (insecure)"
    assert manifest["images"][0]["id"] == f"sha256:{SHA}"


@FUZZ
@given(st.integers(1, 300_000), st.sampled_from(["[", "{\"a\":"]))
def test_json_nesting_and_size_bombs(levels, opener):
    closer = "]" if opener == "[" else "}"
    data = (opener * levels + "1" + closer * levels).encode()
    value = _accepts_or_refuses(lambda d: parse_json(d, what="x", error=StackpinError), data)
    assert (value is not None) == (levels <= 64)


# --- verification reports and grids -----------------------------------------------------


@FUZZ
@given(st.binary(max_size=2000))
def test_report_bytes(data):
    _accepts_or_refuses(reports.parse_report, "r.json", data)


@FUZZ
@given(_mutations(REPORT), _mutations(REPORT))
def test_report_shapes_through_grid_and_diff(before, after):
    for document in (before, after):
        _accepts_or_refuses(reports.parse_report, "r.json", json.dumps(document))
    old = _accepts_or_refuses(reports.load_report, "a.json", json.dumps(before))
    new = _accepts_or_refuses(reports.load_report, "b.json", json.dumps(after))
    if old is not None and new is not None:
        changes = comparison.diff_reports(old, new)
        assert all(isinstance(change, comparison.Difference) for change in changes)


@FUZZ
@given(_mutations({"schema": reports.GRID_SCHEMA,
                   "rows": [{"id": "c1/stable", "checks": {"L1.x": {"status": "pass"}},
                             "numbers": {"gemm": 1.0}}]}))
def test_baseline_grid_shapes(document):
    _accepts_or_refuses(comparison.parse_baseline, "grid.json", json.dumps(document))


# --- matrices ---------------------------------------------------------------------------

# test_matrix's smallest valid cell, with a mount so the run-flag rules have input too.
MATRIX = tomllib.loads(MINIMAL + '[cells.c1.run]\nvolumes = ["/opt/hyhal:/opt/hyhal:ro"]\n')


def _matrix(document: Any) -> None:
    matrix, problems = decode_matrix_lenient(document)
    for problem in problems:
        assert "\n" not in str(problem)
    if matrix is not None:
        for violation in check_cells(matrix.cells.values()):
            assert "\n" not in str(violation)


@FUZZ
@given(_mutations(MATRIX))
def test_matrix_shapes(document):
    if isinstance(document, dict):
        _accepts_or_refuses(_matrix, document)


@FUZZ
@given(_mutations(MATRIX, JSON | HUGE))
def test_matrix_shapes_with_numbers_past_every_bound(document):
    if isinstance(document, dict):
        _accepts_or_refuses(_matrix, document)


@FUZZ
@given(st.binary(max_size=1500))
def test_matrix_files(tmp_path_factory, data):
    from stackpin.matrixfile import parse_toml

    path = tmp_path_factory.mktemp("m") / "m.toml"
    path.write_bytes(data)
    document = _accepts_or_refuses(parse_toml, path)
    if document is not None:
        _accepts_or_refuses(_matrix, document)


# --- wheel file names -------------------------------------------------------------------

WHEEL_PARTS = st.text(alphabet=string.ascii_letters + string.digits + "._+-!/\\:\n ", max_size=20)


@FUZZ
@given(st.one_of(st.text(max_size=80),
                 st.builds(lambda *p: "-".join(p) + ".whl", WHEEL_PARTS, WHEEL_PARTS,
                           WHEEL_PARTS, WHEEL_PARTS, WHEEL_PARTS)))
def test_wheel_filenames(name):
    info = _accepts_or_refuses(parse_wheel_filename, name)
    if info is not None:
        assert info.filename.endswith(".whl")



@FUZZ
@given(st.one_of(HUGE.map(str), st.builds(
    lambda *p: "-".join(p) + ".whl", WHEEL_PARTS | HUGE.map(str), WHEEL_PARTS | HUGE.map(str),
    WHEEL_PARTS, WHEEL_PARTS, WHEEL_PARTS | HUGE.map(str))))
def test_wheel_filenames_with_numbers_past_every_bound(name):
    info = _accepts_or_refuses(parse_wheel_filename, name)
    if info is not None:
        assert len(info.filename) <= 255
    _accepts_or_refuses(wheel_name_version, name)  # the wheelhouse's reader of file names


# --- locks and the wheelhouse -------------------------------------------------------------

WHEEL = {"name": "numpy", "version": "1.26.4", "filename":
         "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl", "sha256": SHA, "group": "stack",
         "source": "index", "origin": "https://files.example/numpy.whl"}
LOCK: dict[str, Any] = {
    "lock_version": 2, "cell": "c1", "cell_digest": SHA, "python": "cp311",
    "source_date_epoch": 0, "base": {"reference": "debian:bookworm", "digest": ""},
    "missing": [], "resolution": {"resolver": "pip", "key": SHA}, "excluded": {},
    "dropped": [{"of": "unsloth", "requirement": "xformers", "reason": "no wheel"}],
    "wheels": [WHEEL, {**WHEEL, "name": "torch", "version": "2.9.0+das.opt1.dtk2604",
                       "filename": "torch-2.9.0+das.opt1.dtk2604-cp311-cp311-linux_x86_64.whl",
                       "source": "vendor", "group": "vendor", "sha256": ""}],
}


@FUZZ
@given(st.binary(max_size=2000))
def test_lock_bytes(data):
    _accepts_or_refuses(lambda d: parse_lock(d, source="c1.lock"), data)


@FUZZ
@given(_mutations(LOCK, JSON | HUGE))
def test_lock_shapes_through_the_wheelhouse_readers(tmp_path_factory, document):
    lock = _accepts_or_refuses(lambda d: parse_lock(d, source="c1.lock"), json.dumps(document))
    if lock is None:
        return
    # Accepted: each file name stays inside the wheelhouse, each requirement is one line.
    for wheel in lock.installed():
        assert "/" not in wheel.filename and not wheel.filename.startswith(".")
    requirements = locked_requirements(lock).splitlines()
    assert len(requirements) == sum(w.source == "index" for w in lock.wheels)
    assert all(line.count("--hash=sha256:") == 1 for line in requirements)
    root = tmp_path_factory.mktemp("wheelhouse")
    (root / "wheels" / "c1").mkdir(parents=True)
    (root / "wheels" / "c1" / WHEEL["filename"]).write_bytes(b"numpy")
    mismatches = verify_wheelhouse(lock, root)
    assert {m.filename for m in mismatches} <= {w.filename for w in lock.installed()}
    assert all(f.filename in {w.filename for w in lock.wheels}
               for f in vendor_files_needed(lock, root))


def test_a_lock_whose_cell_is_not_a_cell_id_is_refused():
    # Found by the fuzz test above: a 4000-digit cell named the wheelhouse folder, and the
    # reader died of "File name too long" instead of refusing the lock.
    import pytest

    from stackpin.errors import ConfigurationError

    for cell in ("9" * 4000, "../c1", "c1/x", ""):
        with pytest.raises(ConfigurationError, match="is not a cell id"):
            parse_lock(json.dumps({**LOCK, "cell": cell}), source="c1.lock")


def test_the_unmutated_lock_is_accepted_and_read_back():
    lock = parse_lock(json.dumps(LOCK), source="c1.lock")
    assert [w.name for w in lock.wheels] == ["numpy", "torch"]
    assert parse_lock(lock.text(), source="again") == lock


# --- through the CLI: the exit code is documented and an error is one line ----------------

CLI_FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def _cli(args: list[str], codes: set[int], prefixes: tuple[str, ...] = ()) -> None:
    """Exit code among ``codes``; an error is one line, or (``prefixes``) every line is
    one of the verb's own report lines (matrix check prints one line per problem)."""
    from click.testing import CliRunner

    from stackpin.cli.main import cli

    done = CliRunner().invoke(cli, args)
    assert done.exit_code in codes, (done.exit_code, done.output)
    assert "Traceback" not in done.output
    lines = done.output.strip().splitlines()
    if prefixes:
        assert all(line.startswith(prefixes) for line in lines), done.output
    elif done.exit_code:
        assert len(lines) == 1, done.output


@CLI_FUZZ
@given(st.binary(max_size=600) | _mutations(REPORT).map(lambda d: json.dumps(d).encode()))
def test_verify_diff_cli(tmp_path, data):
    (tmp_path / "a.json").write_bytes(data)
    (tmp_path / "b.json").write_text(json.dumps(REPORT))
    _cli(["verify", "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")], {0, 6})


@CLI_FUZZ
@given(st.binary(max_size=600))
def test_matrix_check_cli(tmp_path, data):
    (tmp_path / "m.toml").write_bytes(data)
    _cli(["matrix", "check", str(tmp_path / "m.toml")], {0, 3, 4},
         ("ERROR ", "WARN  ", "checked ", "stackpin: "))


@CLI_FUZZ
@given(st.binary(max_size=600) | _mutations(MANIFEST).map(lambda d: json.dumps(d).encode()))
def test_bundle_verify_cli(tmp_path, data):
    folder = tmp_path / "b"
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_bytes(data)
    _cli(["bundle", "verify", str(folder), "--insecure-unsigned"], {7})


def test_diff_of_a_report_whose_metrics_or_reason_are_null_does_not_crash():
    # Found by the fuzz test above: a loaded report may carry "metrics": null.
    old = json.loads(json.dumps(REPORT))
    new = json.loads(json.dumps(REPORT))
    new["checks"][0]["metrics"] = None
    new["checks"][0]["status"], new["checks"][0]["reason"] = "skip", None
    changes = comparison.diff_reports(reports.load_report("a.json", json.dumps(old)),
                                   reports.load_report("b.json", json.dumps(new)))
    assert [c.kind for c in changes] == ["status"]
