#!/usr/bin/env bash
# The README's main command: set up .venv, then run Envoy + Pointsman + a simulated vLLM fleet until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --stack
exec .venv/bin/epp stack "$@"
