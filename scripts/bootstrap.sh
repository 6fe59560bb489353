#!/usr/bin/env bash
# Create .venv (once) and install Pointsman with its test extras. Re-runs are cheap: pip skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.pointsman-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "==> installing Pointsman and its dependencies into .venv (first run takes a minute)"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e ".[dev]${EXTRAS:-}"
  touch "$stamp"
fi
