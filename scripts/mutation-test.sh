#!/usr/bin/env bash
# Mutation testing of verify/'s comparison modules with mutmut 3 (docs/verification.md says
# which modules and functions are scored, and why). Measured like a benchmark; CI does not run it.
#
#   pip install 'mutmut==3.8.1'
#   scripts/mutation-test.sh [MUTANT_GLOB...]     # e.g. 'stackpin_verify.level0.x_judge_*'
#
# mutmut names a mutant after the module the tests import (stackpin_verify.attention), so it
# runs in a scratch tree where the package sits at the top: MUTATION_DIR (default: a new
# temporary directory) gets a copy of verify/stackpin_verify, tests/ and pyproject.toml with
# the [tool.mutmut] table below. The checkout itself is never mutated. A second run in the
# same MUTATION_DIR with no globs continues where the first stopped: it names only the scored
# mutants without a result (mutmut keeps its results there, and re-runs what it is named).
# MUTATION_JOBS sets the parallel workers (default: all cores), PYTHON the interpreter. Prints the score per module
# (scripts/mutation_score.py) at the end.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=${MUTATION_DIR:-$(mktemp -d -t stackpin-mutation.XXXXXX)}
jobs=${MUTATION_JOBS:-$(nproc)}
python=${PYTHON:-python3}

# The comparison modules: every judge of L0-L7, the attention criterion, the level and run
# aggregation (runner, report, checks), the capability decision and issue 22's criteria; one
# list, the scored one (scripts/mutation_score.py SCORED).
mapfile -t modules < <("$python" "$root/scripts/mutation_score.py" --modules)
# MUTATION_MODULES="a b": only these scored modules (a re-measure after new tests).
if [ -n "${MUTATION_MODULES:-}" ]; then
    wanted=" $MUTATION_MODULES "
    kept=()
    for module in "${modules[@]}"; do
        [[ $wanted == *" $module "* ]] && kept+=("$module")
    done
    [ "${#kept[@]}" -gt 0 ] || { echo "mutation-test: no scored module in MUTATION_MODULES ($MUTATION_MODULES)" >&2; exit 2; }
    modules=("${kept[@]}")
fi

mkdir -p "$work"
# -p keeps modification times: mutmut regenerates the mutants only of files that changed.
cp -rp "$root/verify/stackpin_verify" "$work/"
# The tests import stackpin too: a copy of src/, which mutmut puts first on sys.path, so a
# checkout that changes during the run (a rebase) cannot break every mutant's tests at once.
rm -rf "$work/tests" "$work/src"
cp -rp "$root/tests" "$work/tests"
cp -rp "$root/src" "$work/src"
find "$work/tests" "$work/src" -name __pycache__ -prune -exec rm -rf {} +
# mutmut regenerates a module's mutants only when its source is newer than its copy in
# mutants/, and traces again only for new tests: a module added to the list since an earlier
# run in this MUTATION_DIR was copied there unmutated and would stay so, its functions traced
# by no test ("no tests" for every mutant). Its copy goes, and the stats with it.
for module in "${modules[@]}"; do
    copy="$work/mutants/stackpin_verify/$module.py"
    if [ -f "$copy" ] && ! grep -q mutmut "$copy"; then
        rm -f "$copy" "$work/mutants/mutmut-stats.json"
    fi
done

tests=()
for path in "$root"/tests/unit/test_verify_*.py; do
    # tinychat (the Studio demo's data) is no comparison module; its tests reach none.
    [[ $path == *test_verify_tinychat.py ]] && continue
    tests+=("\"tests/unit/$(basename "$path")\"")
done
only=()
for module in "${modules[@]}"; do
    only+=("\"stackpin_verify/$module.py\"")
done
join() { local IFS=","; echo "$*"; }
# MUTATION_PYTEST_ARGS: more pytest arguments, e.g. a --deselect for a test that cannot pass
# on the machine measuring (say so beside the score).
# The tests no mutation run selects: scripts/mutation_score.py LEFT_OUT, their one home.
left_out=""
while read -r test; do
    left_out+=", \"--deselect\", \"$test\""
done < <("$python" "$root/scripts/mutation_score.py" --left-out)
extra=""
for arg in ${MUTATION_PYTEST_ARGS:-}; do
    extra+=", \"$arg\""
done

{
    cat "$root/pyproject.toml"
    cat <<EOF

[tool.mutmut]
source_paths = ["stackpin_verify"]
also_copy = ["src"]
only_mutate = [$(join "${only[@]}")]
pytest_add_cli_args_test_selection = [$(join "${tests[@]}")]
# mutmut learns which tests reach a function by tracing calls in its own process, so tests
# that run the program in a child process never reach one (and its tracing fails in the
# child, outside the scratch tree): they are left out here, they run in CI.
pytest_add_cli_args = ["-p", "no:cacheprovider", "-m", "not docker"$left_out$extra]
# torch is not fork-safe once its thread pools ran: fork each mutant's worker from a server
# that imported the tests but ran none.
process_isolation = "forkserver"
EOF
} > "$work/pyproject.toml"

echo "mutation testing in $work ($jobs workers)"
cd "$work"
start=$(date +%s)
status=0
if [ "$#" -eq 0 ] && compgen -G "$work/mutants/stackpin_verify/*.py.meta" > /dev/null; then
    # A run here before: mutmut re-runs whatever a name selects, so name only the scored
    # mutants it has not judged yet (a run stopped at a time limit continues).
    mapfile -t globs < <("$python" "$root/scripts/mutation_score.py" --pending "$work/mutants")
    echo "continuing: ${#globs[@]} scored mutants not yet judged"
    if [ "${#globs[@]}" -eq 0 ]; then
        "$python" "$root/scripts/mutation_score.py" "$work/mutants"
        exit 0
    fi
    set -- "${globs[@]}"
elif [ "$#" -eq 0 ]; then
    # The scored functions only (scripts/mutation_score.py SCORED); name globs to narrow.
    mapfile -t globs < <("$python" "$root/scripts/mutation_score.py" --globs)
    set -- "${globs[@]}"
fi
"$python" -m mutmut run --max-children "$jobs" "$@" || status=$?
echo "mutmut ran $(( $(date +%s) - start )) s (exit $status)"
"$python" "$root/scripts/mutation_score.py" "$work/mutants"
exit "$status"
