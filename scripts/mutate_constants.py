"""Mutation testing of verify/'s tolerance and bound constants (issue 22 item 7).

mutmut 3 mutates code inside functions only, so a module-level tolerance (attention.FACTOR,
level1.TOLERANCE["bf16"], gemm_shapes.LAMBDA, ...) could be doubled, or halved, with every
test green and no score noticing. This harness mutates each tolerance or bound constant of
the scored modules (scripts/mutation_score.py SCORED) one value at a time, in a scratch copy
of verify/stackpin_verify, and runs the unit tests that can reach it against that copy:

    python scripts/mutate_constants.py [--jobs N] [--out results.json] [--only MODULE ...]
    python scripts/mutate_constants.py --list          # the mutants, nothing run

Operators, per value: ``x2`` and ``/2`` (a binade either way: a tolerance twice as loose,
or a bound twice as tight, that no test tells apart is a tolerance nobody justified), ``+1``
and ``-1`` for integer thresholds (a compute capability, a run length). ``+ulp``/``-ulp``
(the next float either way) are run with ``--ulp`` and reported apart: only a test of the
exact edge can kill them, and that is not asked of every tolerance. The range cases' scales
are exponents (attention_range): x2 and /2 of an exponent is a case twice, or half, as far
up the dtype's range in the log, the reach the criterion is about.

A mutant is killed when the tests fail (pytest exit 1) or time out; survived when they pass;
an error (pytest could not run them) counts against the score. The checkout is never written.
Every numeric module-level constant of a scored module must be named below, in TARGETS or in
NOT_TOLERANCES with why: a new constant nobody classified stops the run (exit 3).
Exit codes: 0 done, 2 usage, 3 an unclassified constant or a clean run that fails.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "verify" / "stackpin_verify"
sys.path.insert(0, str(ROOT / "scripts"))
from mutation_score import LEFT_OUT, SCORED  # noqa: E402 - the one lists of both

SCALE = ("x2", "/2")
STEP = ("+1", "-1")
ULP = ("+ulp", "-ulp")

# (module, constant) -> the operators applied to each of its numeric values; for a tuple
# the index mutated (None: every element), as "module.NAME" keys.
TARGETS: dict[str, tuple[tuple[str, ...], int | None]] = {
    "attention.FACTOR": (SCALE, None),
    "attention.CPU_GRAD_FACTOR": (SCALE, None),
    "attention.EPSILON": (SCALE, None),
    "capability.CUDA_BF16_CAPABILITY": (STEP, 0),
    "capability.CUDA_FLASH_CAPABILITY": (STEP, 0),
    "golden.UNIT_ROUNDOFF": (SCALE, None),
    "golden.FACTOR": (SCALE, None),
    "level1.TOLERANCE": (SCALE, None),
    "level1.BENCH_AGREEMENT": (SCALE, None),
    "level2.SOFTMAX_TOLERANCE": (SCALE, None),
    "level4.TOLERANCE": (SCALE, None),
    "level6.MIN_RUN": (STEP, None),
    "level7.GRAD_TOLERANCE": (SCALE, None),
    "attention_range.VALUE_SCALES": (SCALE, None),
    "attention_range.LOGIT_SCALES": (SCALE, None),
    "gemm_shapes.LAMBDA": (SCALE, None),
    "gemm_shapes.U32": (SCALE, None),
    "gemm_shapes.UTF32": (SCALE, None),
    "gemm_shapes.REDUCTION_ROUNDINGS": (SCALE, None),
    "lora_tensors.ADAM_STEP_BOUND": (SCALE, None),
    "lora_tensors.MEASURABLE_ROUNDOFFS": (SCALE, None),
}

# Numeric module-level constants of scored modules that are no tolerance or bound.
NOT_TOLERANCES: dict[str, str] = {
    "checks._MAX_REASON": "the length a reason is cut to in the report",
    "golden.SEED": "the fixed model's weights: golden-l6.json was computed from them",
    "golden.CASES": "the golden prompts' count: golden-l6.json holds them",
    "golden.PROMPT_LEN": "the golden prompts' length: golden-l6.json holds them",
    "golden.STEPS": "the golden answers' length: golden-l6.json holds them",
    "golden.MAX_CANDIDATES": "how long the prompt search may look (golden write only)",
    "golden.PROMPT_STREAM": "the prompt search's random stream (golden write only)",
    "golden.MAX_REPEAT": "the prompt search's filter (golden write only)",
    "level1.ACCEL_RUNS": "timing repetitions on an accelerator",
    "level1.ACCEL_WARMUP": "timing warm-up on an accelerator",
    "level1.ACCEL_WARMUP_MS": "timing warm-up on an accelerator",
    "level1.ACCEL_MEASURE_MS": "timing budget on an accelerator",
    "level1.ACCEL_MAX_RUNS": "timing repetitions on an accelerator",
    "level2.VECTOR_ELEMENTS": "the Triton kernel's workload (exact comparison)",
    "level2.SOFTMAX_SHAPE": "the Triton kernel's workload",
    "level3.GPU_SHAPES": "workload: the shapes judged (the criterion is attention.*)",
    "level3.CPU_SHAPES": "workload: the shapes judged",
    "level3.SPEEDUP_SHAPE": "the timed shape of an optional speed report",
    "level4.SHAPE": "the quantized matmul's workload",
    "level5.LORA_STEPS": "workload: the bounds derive from it (optimizer_steps, tensors_learned)",
    "level5.LORA_LR": "workload: the bounds are derived from it (tensors_learned)",
    "level5.FULL_LR": "workload of the full-parameter step",
    "level5.EXTRA_TOKENS": "how far generation may run past the answer",
    "level6.BATCH_EXTEND": "workload: how many golden tokens lengthen the batched prompts",
    "level7.TIMEOUT_S": "a time limit, not a tolerance",
    "runner.LEVEL_MODULES": "level numbers, not a tolerance",
    "runner.DEVICE_LEVELS": "level numbers (what needs a card), not a tolerance",
    "masked.PADDED_LENGTHS": "workload: the padded batch's lengths",
    "masked.HEADS": "workload: the head counts",
    "masked.HEAD_DIM": "workload: the head dim",
    "masked.PAD_FILL": "workload: what padding holds (garbage, finite)",
    "masked.VARLEN_Q": "workload: the uneven varlen lengths",
    "masked.VARLEN_K": "workload: the uneven varlen lengths",
    "masked.BIAS_SEED": "workload: the bias's draw (any seed serves; fixed so reports repeat)",
    "attention_range.SHAPE": "workload: the range cases' shape",
    "dtk_env.SOURCE_TIMEOUT_S": "a time limit, not a tolerance",
    "gemm_shapes.CPU_SHAPES": "workload: the GEMM shapes (their K enters the bound)",
    "gemm_shapes.GPU_SHAPES": "workload: the GEMM shapes (their K enters the bound)",
}

# Tests that never reach verify/ or cannot run under this harness.
SKIPPED_TESTS = ("test_verify_tinychat.py",)


@dataclass(frozen=True)
class Mutant:
    module: str
    constant: str
    leaf: str  # "" for a scalar, "[key]" for a dict entry, "[i]" for a tuple element
    op: str
    original: str
    mutated: str
    start: tuple[int, int]  # (line, column) of the value's source, 1-based line
    end: tuple[int, int]

    @property
    def name(self) -> str:
        return f"{self.module}.{self.constant}{self.leaf} {self.op}"

    @property
    def scored(self) -> bool:
        return self.op not in ULP


@dataclass
class Outcome:
    mutant: str
    module: str
    constant: str
    op: str
    original: str
    mutated: str
    status: str  # killed | survived | error
    exit_code: int | None
    seconds: float
    failed_test: str | None


def _numeric(node: ast.AST) -> float | int | None:
    """The value of a numeric literal or a constant arithmetic expression of them."""
    names = {n for n in ast.walk(node) if isinstance(n, ast.Name)}
    if names or isinstance(node, ast.Tuple | ast.Dict | ast.List):
        return None
    try:
        value = eval(compile(ast.Expression(node), "<constant>", "eval"), {"__builtins__": {}})
    except Exception:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


@functools.cache
def module_constants(module: str) -> dict[str, ast.expr]:
    """Module-level NAME = value assignments that hold at least one number."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        target: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if not isinstance(target, ast.Name):
            continue
        numbers = [n for n in ast.walk(value) if isinstance(n, ast.Constant)
                   and isinstance(n.value, int | float) and not isinstance(n.value, bool)]
        if numbers:
            found[target.id] = value
    return found


def unclassified() -> list[str]:
    known = set(TARGETS) | set(NOT_TOLERANCES)
    missing = []
    for module in SCORED:
        for name in module_constants(module):
            if f"{module}.{name}" not in known:
                missing.append(f"{module}.{name}")
    stale = sorted(k for k in known
                   if k.split(".")[1] not in module_constants(k.split(".")[0]))
    return missing + [f"{k} (named here, no longer in its module)" for k in stale]


def mutate_value(value: float | int, op: str) -> float | int | None:
    if op == "x2":
        return value * 2
    if op == "/2":  # an integer stays one (an exponent halved rounds toward zero)
        return int(value / 2) if isinstance(value, int) else value / 2
    if op == "+1":
        return value + 1
    if op == "-1":
        return value - 1
    if op == "+ulp":
        return math.nextafter(float(value), math.inf)
    if op == "-ulp":
        return math.nextafter(float(value), -math.inf)
    msg = f"unknown operator {op}"
    raise ValueError(msg)


def _leaves(value: ast.expr, index: int | None) -> list[tuple[str, ast.expr]]:
    if isinstance(value, ast.Dict):
        out = []
        for key, item in zip(value.keys, value.values, strict=True):
            label = ast.literal_eval(key) if key is not None else "?"
            out.extend((f"[{label!r}]{sub}", node) for sub, node in _leaves(item, index))
        return out
    if isinstance(value, ast.Tuple | ast.List):
        picked = range(len(value.elts)) if index is None else [index]
        return [(f"[{i}]", value.elts[i]) for i in picked]
    return [("", value)]


def mutants(*, ulp: bool = False, only: set[str] | None = None) -> list[Mutant]:
    found = []
    for key, (ops, index) in TARGETS.items():
        module, constant = key.split(".")
        if only and module not in only:
            continue
        value = module_constants(module)[constant]
        for leaf, node in _leaves(value, index):
            number = _numeric(node)
            if number is None:
                msg = f"{key}{leaf} is not a number: {ast.unparse(node)}"
                raise ValueError(msg)
            for op in ops + (ULP if ulp and isinstance(number, float) else ()):
                new = mutate_value(number, op)
                if new is None or new == number:
                    continue
                found.append(Mutant(
                    module, constant, leaf, op, ast.unparse(node), repr(new),
                    (node.lineno, node.col_offset),
                    (node.end_lineno or node.lineno, node.end_col_offset or 0),
                ))
    return found


def apply(source: str, mutant: Mutant) -> str:
    """The module's source with the one value replaced (by position, so a value written
    twice in the file is changed only where the constant is defined)."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode("utf-8")))
    raw = source.encode("utf-8")
    start = offsets[mutant.start[0] - 1] + mutant.start[1]
    end = offsets[mutant.end[0] - 1] + mutant.end[1]
    replacement = f"({mutant.mutated})" if mutant.mutated.startswith("-") else mutant.mutated
    return (raw[:start] + replacement.encode("utf-8") + raw[end:]).decode("utf-8")


# --- which tests can reach a constant ----------------------------------------------------


@functools.cache
def _imports(path: Path) -> set[str]:
    """The stackpin_verify modules a file imports, by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "stackpin_verify":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("stackpin_verify."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("stackpin_verify."):
                    found.add(alias.name.split(".")[1])
    return found


@functools.cache
def reaching(module: str) -> set[str]:
    """Every stackpin_verify module whose imports lead (transitively) to ``module``."""
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py")}
    reach = {module}
    changed = True
    while changed:
        changed = False
        for name, deps in graph.items():
            if name not in reach and deps & reach:
                reach.add(name)
                changed = True
    return reach


@functools.cache
def test_files(module: str) -> list[str]:
    """The verify test files that import a module reaching ``module``; those importing it
    directly first (with -x a killed mutant stops at the first failure)."""
    reach = reaching(module)
    direct, indirect = [], []
    for path in sorted((ROOT / "tests" / "unit").glob("test_verify_*.py")):
        if path.name in SKIPPED_TESTS:
            continue
        imported = _imports(path)
        rel = str(path.relative_to(ROOT))
        if module in imported:
            direct.append(rel)
        elif imported & reach or "stackpin_verify" in path.read_text(encoding="utf-8"):
            indirect.append(rel)
    return direct + indirect


@functools.cache
def readers(module: str, constant: str) -> list[str]:
    """mutmut's names of the functions that read the constant: in its module, in modules
    that import it by name or read ``module.CONSTANT``, and through module-level constants
    computed from it (a default argument counts: it is read when the function is defined)."""
    found: list[str] = []
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names: set[str] = {constant} if path.stem == module else set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == f"stackpin_verify.{module}":
                names.update(a.asname or a.name for a in node.names if a.name == constant)
        for node in tree.body:  # constants derived from it, in file order
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name) and target.id != constant \
                        and _reads(node.value, names, constant, module):
                    names.add(target.id)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if _reads(node, names, constant, module):
                    found.append(f"stackpin_verify.{path.stem}.x_{node.name}")
            elif isinstance(node, ast.ClassDef):
                found.extend(
                    f"stackpin_verify.{path.stem}.x\u01c1{node.name}\u01c1{item.name}"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and _reads(item, names, constant, module)
                )
    return found


def _reads(tree: ast.AST, names: set[str], constant: str, module: str) -> bool:
    """Whether ``tree`` reads one of ``names`` or ``module.constant``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names:
            return True
        if (isinstance(node, ast.Attribute) and node.attr == constant
                and isinstance(node.value, ast.Name) and node.value.id == module):
            return True
    return False


@functools.cache
def direct_tests(module: str, constant: str) -> set[str]:
    """The test functions that read the constant themselves (``level4.TOLERANCE[kind]``,
    or imported by name): no function trace shows them."""
    found: set[str] = set()
    for path in sorted((ROOT / "tests" / "unit").glob("test_verify_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == f"stackpin_verify.{module}" for a in node.names
                 if a.name == constant}
        rel = str(path.relative_to(ROOT))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test") \
                    and _reads(node, names, constant, module):
                found.add(f"{rel}::{node.name}")
    return found


def selected_tests(mutant: Mutant, stats: dict[str, list[str]] | None) -> list[str]:
    """With mutmut's stats (which tests ran each function, traced): the tests that ran a
    function reading the constant, and those reading it themselves. A reader in a module
    mutmut does not mutate (so never traced) brings in its module's test files; one in a
    mutated module that no test ran brings none (GPU-only code, the golden writer)."""
    if stats is None:
        return test_files(mutant.module)
    tests: set[str] = set(direct_tests(mutant.module, mutant.constant))
    files: set[str] = set()
    for reader in readers(mutant.module, mutant.constant):
        module = reader.split(".")[1]
        if reader in stats:
            tests.update(stats[reader])
        elif module not in SCORED:
            files.update(test_files(module))
    tests = {t for t in tests if t.split("::")[0] not in files}
    return sorted(files) + sorted(tests)


# --- running -----------------------------------------------------------------------------


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def run_tests(package_parent: Path, tests: list[str], extra: list[str],
              timeout: float) -> tuple[int | None, float, str | None, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(
                   [str(package_parent), *filter(None, [os.environ.get("PYTHONPATH")])]))
    left_out = [f"--deselect={test}" for test in LEFT_OUT]
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider",
               "-m", "not docker", *left_out, *tests, *extra]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - start, "timeout", ""
    found = _FAILED.search(done.stdout)
    tail = (done.stdout + done.stderr)[-2000:]
    return done.returncode, time.perf_counter() - start, found.group(1) if found else None, tail


def judge(mutant: Mutant, scratch: Path, extra: list[str], timeout: float,
          stats: dict[str, list[str]] | None = None) -> Outcome:
    parent = scratch / mutant.name.replace(" ", "_").replace("/", "div").replace("'", "")
    shutil.copytree(PACKAGE, parent / "stackpin_verify",
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = parent / "stackpin_verify" / f"{mutant.module}.py"
    target.write_text(apply(target.read_text(encoding="utf-8"), mutant), encoding="utf-8")
    tests = selected_tests(mutant, stats)
    if not tests:  # no test runs the code that reads it
        shutil.rmtree(parent, ignore_errors=True)
        return Outcome(mutant.name, mutant.module, mutant.constant + mutant.leaf, mutant.op,
                       mutant.original, mutant.mutated, "survived", None, 0.0, "no test reads it")
    code, seconds, failed, _ = run_tests(parent, tests, extra, timeout)
    shutil.rmtree(parent, ignore_errors=True)
    if code is None:
        status = "killed"  # timed out: the tests noticed, as mutmut counts it
    elif code == 1:
        status = "killed"
    elif code == 0:
        status = "survived"
    else:
        status = "error"
    return Outcome(mutant.name, mutant.module, mutant.constant + mutant.leaf, mutant.op,
                   mutant.original, mutant.mutated, status, code, round(seconds, 1), failed)


def clean_run(found: list[Mutant], scratch: Path, extra: list[str], timeout: float,
              stats: dict[str, list[str]] | None) -> str | None:
    """The selected tests must pass on the unmutated copy, or every mutant 'dies'."""
    parent = scratch / "clean"
    shutil.copytree(PACKAGE, parent / "stackpin_verify",
                    ignore=shutil.ignore_patterns("__pycache__"))
    tests = sorted({t for m in found for t in selected_tests(m, stats)})
    code, seconds, failed, tail = run_tests(parent, tests, extra, timeout)
    print(f"clean run: exit {code} in {seconds:.0f} s ({len(tests)} tests or files)", flush=True)
    if code != 0:
        return f"the unmutated tests fail (exit {code}, first {failed}):\n{tail}"
    return None


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    per_module: dict[str, dict[str, int]] = {}
    per_constant: dict[str, dict[str, str]] = {}
    for o in outcomes:
        if o.op in ULP:
            continue
        row = per_module.setdefault(o.module, {"mutants": 0, "killed": 0, "survived": 0,
                                                "error": 0})
        row["mutants"] += 1
        row[o.status] += 1
        per_constant.setdefault(f"{o.module}.{o.constant}", {})[o.op] = o.status
    for row in per_module.values():
        row["score_percent"] = round(100.0 * row["killed"] / row["mutants"], 1)
    total = {k: sum(r[k] for r in per_module.values())
             for k in ("mutants", "killed", "survived", "error")}
    total["score_percent"] = round(100.0 * total["killed"] / max(total["mutants"], 1), 1)
    return {"per_module": per_module, "total": total, "per_constant": per_constant}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once")
    parser.add_argument("--out", type=Path, help="write every outcome and the summary (JSON)")
    parser.add_argument("--only", nargs="*", default=None, help="modules to mutate")
    parser.add_argument("--ulp", action="store_true", help="also +-1 ulp (reported apart)")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per mutant")
    parser.add_argument("--stats", type=Path,
                        help="mutmut's mutants/mutmut-stats.json: run only the tests that ran "
                             "a function reading the constant (else whole test files)")
    parser.add_argument("--skip-clean-run", action="store_true",
                        help="the selected tests are known green here (a mutmut run just "
                             "checked them)")
    parser.add_argument("--pytest-arg", action="append", default=[],
                        help="more pytest arguments, e.g. --pytest-arg=--deselect=ID")
    args = parser.parse_args(argv)
    missing = unclassified()
    if missing:
        print("unclassified constants (add each to TARGETS or NOT_TOLERANCES): "
              + ", ".join(missing), file=sys.stderr)
        return 3
    only = set(args.only) if args.only else None
    unknown = (only or set()) - set(SCORED)
    if unknown:
        parser.error(f"not a scored module: {', '.join(sorted(unknown))}")
    found = mutants(ulp=args.ulp, only=only)
    stats = None
    if args.stats:
        stats = json.loads(args.stats.read_text(encoding="utf-8"))["tests_by_mangled_function_name"]
    if args.list:
        for m in found:
            print(f"{m.name:60s} {m.original} -> {m.mutated}  "
                  f"({len(selected_tests(m, stats))} tests or files)")
        return 0
    with tempfile.TemporaryDirectory(prefix="stackpin-constants-") as tmp:
        scratch = Path(tmp)
        if not args.skip_clean_run:
            broken = clean_run(found, scratch, args.pytest_arg, args.timeout, stats)
            if broken:
                print(broken, file=sys.stderr)
                return 3
        start = time.perf_counter()
        outcomes = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(judge, m, scratch, args.pytest_arg, args.timeout, stats)
                       for m in found]
            for future in concurrent.futures.as_completed(futures):
                outcome = future.result()
                outcomes.append(outcome)
                print(f"{outcome.status:<8} {outcome.mutant:<60} {outcome.original} -> "
                      f"{outcome.mutated} ({outcome.seconds:.0f} s"
                      f"{', ' + outcome.failed_test if outcome.failed_test else ''})", flush=True)
        elapsed = time.perf_counter() - start
    outcomes.sort(key=lambda o: o.mutant)
    result = summary(outcomes)
    result["seconds"] = round(elapsed, 1)
    result["jobs"] = args.jobs
    print(json.dumps({"per_module": result["per_module"], "total": result["total"]}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(
            {"summary": result, "outcomes": [asdict(o) for o in outcomes]}, indent=1) + "\n",
            encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
