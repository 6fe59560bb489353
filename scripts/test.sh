#!/usr/bin/env bash
# The README's test command: sets up .venv, then runs ruff, the type checker (mypy, see pyproject.toml) and the whole
# test suite (real Envoy, real processes). The suite runs on PYTEST_WORKERS processes (pytest-xdist; default 3: most
# tests wait on real processes and sockets, so one more worker than this machine's 2 cores keeps both busy) while
# mypy checks the code beside it; either failing fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --test-deps
.venv/bin/ruff check .
.venv/bin/mypy > .venv/mypy.log 2>&1 &
mypy_pid=$!
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-3}" "$@" || status=$?
if wait "$mypy_pid"; then
  tail -1 .venv/mypy.log
else
  cat .venv/mypy.log >&2
  status=1
fi
exit "$status"
