#!/usr/bin/env bash
# The test command: install the project with its dev extras into .venv, start a throwaway
# PostgreSQL server for the PostgreSQL half of the store tests, then lint, type-check, test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The CPU build of torch first: verl (a dev dependency, for rl/) would otherwise pull a
# multi-GB CUDA build.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[dev]"
if [ -z "${WORLDCTL_TEST_PG_URL:-}" ]; then
  if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    eval "$(.ci/start-postgres.sh)"
  else
    echo "note: no PostgreSQL server installed (apt-get install postgresql); its tests will skip" >&2
  fi
fi
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/pytest "$@"
