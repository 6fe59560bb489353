#!/usr/bin/env bash
# The README's test command: sets up .venv, then runs ruff, the type checker (mypy, see pyproject.toml) and the whole
# test suite (real Envoy, real processes).
#
# The suite runs on PYTEST_WORKERS processes (pytest-xdist, default 2: this machine's cores) while mypy checks the
# code beside it; then the tests marked `realtime` (they assert wall-clock bounds: ejection within a cool-down, a fit
# converging in time, Redis timeouts) run one at a time on the quiet machine. Arguments go to pytest: with any, the
# tests they name run in one parallel pass. Anything failing fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --test-deps
.venv/bin/ruff check .
.venv/bin/mypy > .venv/mypy.log 2>&1 &
mypy_pid=$!
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
status=0
if [ "$#" -gt 0 ]; then
  "${pytest[@]}" -n "${PYTEST_WORKERS:-2}" "$@" || status=$?
else
  "${pytest[@]}" -n "${PYTEST_WORKERS:-2}" -m "not realtime" || status=$?
  "${pytest[@]}" -m realtime || status=$?
fi
if wait "$mypy_pid"; then
  tail -1 .venv/mypy.log
else
  cat .venv/mypy.log >&2
  status=1
fi
exit "$status"
