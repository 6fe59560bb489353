#!/usr/bin/env bash
# The README's test command: sets up .venv, then runs ruff, the type checker (mypy, see pyproject.toml) and the whole test suite (real Envoy, real processes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --test-deps
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
