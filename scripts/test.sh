#!/usr/bin/env bash
# README command 2: every check the project has. Lint and types first (cheap), then the
# unit tests, then the integration tests against the real Docker daemon (marker docker).
set -uo pipefail
cd "$(dirname "$0")/.."
export STACKPIN_REQUIRE_DOCKER=${STACKPIN_REQUIRE_DOCKER:-1}

.venv/bin/ruff check src tests verify || exit 1
.venv/bin/mypy || exit 1  # files: pyproject.toml (src/stackpin and verify/)
# The slowest tests, each run: what every heavy test costs stays in the CI log.
.venv/bin/pytest --durations=30 "$@"
rc=$?
# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
[ "$rc" = 5 ] && { echo "test: pytest collected no tests" >&2; exit 1; }
exit "$rc"
