#!/usr/bin/env bash
# The test command: install the project with its dev extras into .venv, start a throwaway
# PostgreSQL server for the PostgreSQL half of the store tests, then lint, type-check, test.
# `--install-only` stops after the install (.ci/run overlaps it with apt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The CPU build of torch first: verl (a dev dependency, for rl/) would otherwise pull a
# multi-GB CUDA build.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[dev]"
if [ "${1:-}" = "--install-only" ]; then exit 0; fi
if [ -z "${WORLDCTL_TEST_PG_URL:-}" ]; then
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    eval "$(.ci/start-postgres.sh)"
  else
    echo "note: no PostgreSQL server installed (apt-get install postgresql); its tests will skip" >&2
  fi
fi
.venv/bin/ruff check .
# mypy runs beside the tests (one core is mostly idle while pytest waits on subprocesses);
# its verdict is reported, and counts, once the tests are done.
mypy_log=$(mktemp)
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
status=0
.venv/bin/pytest "$@" || status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
cat "$mypy_log"
rm -f "$mypy_log"
if [ "$mypy_status" != 0 ]; then exit "$mypy_status"; fi
exit "$status"
