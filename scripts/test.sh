#!/usr/bin/env bash
# README command 2: every check the project has. Lint and types first (cheap), then the
# tests without a daemon on every core (pytest-xdist), then the integration tests against
# the real Docker daemon (marker docker) in two lanes: the CUDA images on their own engine,
# beside the rest one at a time (they share the default daemon and its builds).
# Arguments go to one plain pytest run instead (`bash scripts/test.sh tests/unit -k lock`).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export STACKPIN_REQUIRE_DOCKER=${STACKPIN_REQUIRE_DOCKER:-1}

.venv/bin/ruff check src tests verify || exit 1
.venv/bin/mypy || exit 1  # files: pyproject.toml (src/stackpin and verify/)

# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
run_pytest() {
    .venv/bin/pytest "$@"
    local rc=$?
    [ "$rc" = 5 ] && { echo "test: pytest collected no tests ($*)" >&2; return 1; }
    return "$rc"
}

if [ "$#" -gt 0 ]; then
    run_pytest "$@"
    exit $?
fi
# The slowest tests, each run: what every heavy test costs stays in the CI log.
rc=0
# worksteal: each worker starts on its own share (tests/conftest.py spreads the slow ones
# across the shares) and an idle one takes queued tests from a busy one.
run_pytest --durations=15 --numprocesses auto --dist worksteal -m "not docker" || rc=$?
# The Docker tier in two lanes, two pytest sessions at once: the modules marked own_lane
# (the CUDA images: their own engine, checkout copy, base and tags) beside the rest, which
# run one at a time in collection order since they share the default engine's images and
# tags. The own lane's lines are prefixed so a log cut off at CI's limit still shows both.
run_pytest --durations=10 -m "docker and own_lane" > >(sed -u 's/^/[own lane] /') 2>&1 &
own_lane=$!
run_pytest --durations=30 -m "docker and not own_lane" || rc=$?
wait "$own_lane" || rc=$?
exit "$rc"
