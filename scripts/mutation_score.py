"""Mutation score of verify/'s comparison code, per module, from a mutmut 3 run.

usage: python scripts/mutation_score.py MUTANTS_DIR [--list survived|all] [--json RAW.json]
       python scripts/mutation_score.py --globs    (mutmut name patterns of the scored set)
       python scripts/mutation_score.py --modules  (the modules mutmut mutates: SCORED's)
       python scripts/mutation_score.py --pending MUTANTS_DIR  (scored mutants not yet judged)
       python scripts/mutation_score.py --left-out (the tests no mutation run selects)

MUTANTS_DIR is the ``mutants/`` folder that ``scripts/mutation-test.sh`` leaves in its
scratch tree. mutmut mutates whole modules; the score the issue asks for (>= 90 %) counts the
functions below: every judge of L0-L7, the attention criterion, the comparison helpers they
call, and the paths that aggregate results into the exit code. The rest of each module
(GPU-only timing, process launching, device queries) is listed as "other", unscored.

Killed: a test failed (timeouts count: the tests noticed). Survived: every test passed.
Excluded: an equivalent mutant (same behaviour, so no test can kill it), each with its reason
in EQUIVALENT; they leave the denominator. Anything else (no test ran it, not yet run) counts
against the score.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections import Counter
from pathlib import Path

# Tests no mutation run selects (mutmut's nor mutate_constants.py's), one home for both: they
# run verify in a child process, which mutmut's tracing never reaches, and they expect a CPU
# host's report (on a GPU host they are red before any mutation). CI runs them.
LEFT_OUT = (
    "tests/unit/test_verify_cli.py",
    "tests/unit/test_verify_broken_kernel.py::test_no_kernel_image_from",
    "tests/unit/test_verify_broken_kernel.py::test_torch_import_killing",
    "tests/unit/test_verify_broken_kernel.py::test_kernel_narrowing_bf16_fails",
)

# Module -> the functions scored (fnmatch patterns on the function or Class.method name).
SCORED: dict[str, tuple[str, ...]] = {
    "attention": ("*",),
    "boundary": ("judge_boundary",),
    "capability": ("accelerator_unsupported", "_sm_capability", "cpu_unsupported",
                   "unsupported", "flash_unsupported"),
    "checks": ("require", "run_check"),
    "level0": ("judge_*", "_arch_key", "local_label", "_release", "satisfies"),
    "level1": ("judge_*", "accel_runs"),
    "level2": ("judge_*",),
    "level3": ("_judged", "varlen_lengths", "_compare_varlen", "_math_bshd"),
    "level4": ("judge_*", "relative_rms"),
    "golden": ("relative_tolerance",),
    "level5": ("check_adapter_roundtrip", "judge_recall"),
    "level6": ("judge_*", "detect_*", "step_errors", "worst_ratio"),
    "level7": ("judge_*", "choose_launch"),
    "report": ("summarise", "exit_code"),
    "runner": ("judge_level",),
    "training": ("judge_*",),
    # Issue 22's criteria.
    "masked": ("key_valid", "padded_mask", "additive", "exact_bias", "sdpa_masked",
               "pad_batch", "unpad_rows", "_bounds", "masked_math", "per_sequence_reference",
               "check_padded_sdpa", "judged", "check_varlen_qk"),
    "attention_range": ("range_inputs", "max_logit", "judge_finite", "compare_forward",
                        "check_range"),
    "dtk_env": ("*",),
    "gemm_shapes": ("unit_roundoff", "bound_for", "judge_product", "unravel", "operands",
                    "check_shape"),
    "lora_tensors": ("*",),
    "batched": ("*",),
}

# Mutant name -> why it is equivalent: no input the function can get tells it apart from the
# original. (The four "on CPU" equivalents, a device or dtype argument dropped in
# level3._compare_varlen and level5.check_adapter_roundtrip, are killed since issue 22 by
# tests that pass the meta device and bf16: they are scored like any mutant.)
_P = "stackpin_verify."
_NAN = 'float("NAN") is the same NaN as float("nan")'
_TO_NONE = ".to(None) keeps the dtype; the subtraction promotes to the reference's dtype anyway"
_TMP_PREFIX = "the temporary directory's name prefix"
_PROBE = "capability.unsupported never reads what the probe returns, only what it raises"
_SAME_SPANS = ("zip(..., strict) loosened: VARLEN_Q and VARLEN_K hold three lengths each "
               "(test_uneven_varlen_cases_have_their_own_key_lengths_and_a_decode_row)")
EQUIVALENT: dict[str, str] = {
    _P + "level0.x__arch_key__mutmut_9": "split(':') keeps the same first field",
    _P + "level0.x__arch_key__mutmut_12": "split(':', 2) keeps the same first field",
    _P + "level1.x_judge_bench_agreement__mutmut_10": _NAN,
    _P + "level1.x_judge_gemm__mutmut_2": _TO_NONE,
    _P + "level5.x_check_adapter_roundtrip__mutmut_3": _TMP_PREFIX,
    _P + "level5.x_check_adapter_roundtrip__mutmut_4": _TMP_PREFIX,
    _P + "level5.x_check_adapter_roundtrip__mutmut_5": _TMP_PREFIX,
    _P + "dtk_env.x_source_script__mutmut_5": "check=None is falsy as check=False",
    _P + "dtk_env.x_source_script__mutmut_9": "without check=, subprocess.run's default is False",
    _P + "masked.x_check_varlen_qk__mutmut_8": _PROBE,
    _P + "masked.x_check_varlen_qk__mutmut_70": _SAME_SPANS,
    _P + "masked.x_check_varlen_qk__mutmut_73": _SAME_SPANS,
    _P + "masked.x_check_varlen_qk__mutmut_74": _SAME_SPANS,
    _P + "level6.x_detect_degenerate__mutmut_5": "all ids are equal there: ids[1] == ids[0]",
    _P + "level6.x_detect_degenerate__mutmut_7": "no character equals the initial run_char "
                                                 "'XXXX' either, so the first run starts at 1",
    _P + "level6.x_detect_degenerate__mutmut_8": "the first character never continues a run: "
                                                 "run_len is set to 1 whatever it was",
    _P + "level6.x_detect_degenerate__mutmut_9": "best_char is overwritten at the first "
                                                 "character; empty text reports it only for "
                                                 "min_run <= 0, never used",
}

KILLED = {1, 3, 24, -24, 152, 255, 36}  # test failure, pytest error, timeouts
SURVIVED = {0}


NO_TESTS, TYPE_CHECKED = 33, 37  # judged: no test reaches it / the type checker caught it


def pending(code: int | None) -> bool:
    """Not judged yet: never run, or cut short (an interrupted worker's code is neither a
    test failure nor a pass)."""
    return classify(code) in ("unchecked", "other") and code not in (NO_TESTS, TYPE_CHECKED)


def function_of(key: str) -> tuple[str, str]:
    """('level0', 'judge_backend') from 'stackpin_verify.level0.x_judge_backend__mutmut_3';
    methods come as 'TensorError.max_ok'."""
    path, _, name = key.partition("__mutmut_")[0].rpartition(".")
    module = path.rpartition(".")[2]
    if name.startswith("x_"):
        return module, name[2:]
    parts = name.split("\u01c1")  # mutmut's separator: x<sep>Class<sep>method
    return module, f"{parts[1]}.{parts[2]}"


def scored(module: str, function: str) -> bool:
    patterns = SCORED.get(module, ())
    return any(fnmatch.fnmatch(function, p) for p in patterns)


def classify(code: int | None) -> str:
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    return "unchecked" if code is None else "other"


def load(mutants: Path) -> dict[str, int | None]:
    results: dict[str, int | None] = {}
    for meta in sorted(mutants.glob("stackpin_verify/*.py.meta")):
        results.update(json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"])
    return results


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole else "-"


def score_line(label: str, counts: Counter[str]) -> str:
    """The score counts every mutant not excluded (an unchecked one against it); "of
    checked" only those a test run has judged, for a run stopped early."""
    total = sum(counts.values())
    unchecked = counts["unchecked"] + counts["other"]
    score = _percent(counts["killed"], total - counts["excluded"])
    checked = _percent(counts["killed"], counts["killed"] + counts["survived"])
    return (
        f"{label:<12} {total:>5} {counts['killed']:>6} {counts['survived']:>8} "
        f"{counts['excluded']:>8} {unchecked:>9} {score:>9} {checked:>10}"
    )


def mutant_globs() -> list[str]:
    """mutmut run's name patterns that select exactly the scored functions."""
    globs = []
    for module, patterns in SCORED.items():
        for pattern in patterns:
            if pattern == "*":
                globs.append(f"stackpin_verify.{module}.*")
            elif "." in pattern:
                cls, method = pattern.split(".")
                globs.append(f"stackpin_verify.{module}.x\u01c1{cls}\u01c1{method}__mutmut_*")
            else:
                globs.append(f"stackpin_verify.{module}.x_{pattern}__mutmut_*")
    return globs


def raw_record(results: dict[str, int | None], per_module: dict[str, Counter[str]],
               total: Counter[str], unscored: Counter[str]) -> dict[str, object]:
    """mutmut's own exit code for every mutant it made (its ``exit_code_by_key``, merged
    across modules), each one's state as scored here, and the counts per module."""
    mutants = {}
    for key, code in sorted(results.items()):
        module, function = function_of(key)
        state = "excluded" if key in EQUIVALENT else classify(code)
        mutants[key] = {"exit_code": code, "state": state, "scored": scored(module, function)}
    counts = {module: dict(c) for module, c in sorted(per_module.items())}
    return {"mutants": mutants, "per_module": counts, "scored": dict(total),
            "other": dict(unscored), "equivalent": EQUIVALENT}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mutants", type=Path, nargs="?")
    parser.add_argument("--list", choices=("survived", "all"), default="survived")
    parser.add_argument("--globs", action="store_true")
    parser.add_argument("--modules", action="store_true")
    parser.add_argument("--left-out", action="store_true",
                        help="print the tests no mutation run selects, one per line")
    parser.add_argument("--pending", action="store_true",
                        help="print the scored mutants of MUTANTS_DIR no run has judged yet")
    parser.add_argument("--json", type=Path, help="write the raw results and the score here")
    parser.add_argument("--checked-only", action="store_true",
                        help="--json lists only the mutants a run judged (a narrow run)")
    args = parser.parse_args(argv)
    if args.globs:
        print("\n".join(mutant_globs()))
        return 0
    if args.modules:
        print("\n".join(SCORED))
        return 0
    if args.left_out:
        print("\n".join(LEFT_OUT))
        return 0
    if args.mutants is None:
        parser.error("MUTANTS_DIR is required")
    results = load(args.mutants)
    if args.pending:
        # mutmut re-runs every mutant a name or glob selects: a run that stopped continues
        # by naming only those without a result.
        print("\n".join(key for key, code in sorted(results.items())
                        if pending(code) and scored(*function_of(key))))
        return 0
    if not results:
        print(f"no mutmut results under {args.mutants}", file=sys.stderr)
        return 2
    per_module: dict[str, Counter[str]] = {}
    unscored: Counter[str] = Counter()
    listed = []
    for key, code in sorted(results.items()):
        module, function = function_of(key)
        state = "excluded" if key in EQUIVALENT else classify(code)
        if not scored(module, function):
            unscored[state] += 1
            continue
        per_module.setdefault(module, Counter())[state] += 1
        if args.list == "all" or state in ("survived", "unchecked", "other"):
            listed.append(f"  {state:<9} {key} (exit {code})")
    header = f"{'module':<12} {'total':>5} {'killed':>6} {'survived':>8} {'excluded':>8} " \
             f"{'unchecked':>9} {'score':>9} {'of checked':>10}"
    print(header)
    total: Counter[str] = Counter()
    for module in sorted(per_module):
        print(score_line(module, per_module[module]))
        total.update(per_module[module])
    print(score_line("scored", total))
    print(score_line("(other)", unscored))
    if args.json:
        raw = {k: v for k, v in results.items() if v is not None} if args.checked_only \
            else results
        args.json.write_text(json.dumps(raw_record(raw, per_module, total, unscored),
                                        indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if listed:
        print("not killed (scored):")
        print("\n".join(listed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
