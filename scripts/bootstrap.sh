#!/usr/bin/env bash
# Create .venv (once) and install Pointsman with its test extras (EXTRAS=",bench" adds the benchmark peers). Re-runs are cheap: pip runs only when
# pyproject.toml changed since the last install. With --test-deps (scripts/test.sh) it also installs the Debian
# packages the tests need when they are missing (scripts/debian-packages.sh).
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
  if ! { .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e ".[dev${EXTRAS:-}]"; } \
      > .venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    echo "error: installing the dependencies failed (log above, also in .venv/pip.log)" >&2
    exit 1
  fi
  touch "$stamp"
fi
# xds-protos ships an old copy of the opentelemetry.proto modules; installed after opentelemetry-proto it overwrites
# them and the OTLP exporters (the [otel] extra, in the test extras) cannot import: put opentelemetry-proto's back.
if ! .venv/bin/python -c "from opentelemetry.proto.common.v1 import common_pb2 as m; m.InstrumentationScope" \
    >/dev/null 2>&1 && .venv/bin/pip show opentelemetry-proto >/dev/null 2>&1; then
  version=$(.venv/bin/pip show opentelemetry-proto | awk '/^Version:/ {print $2}')
  echo "==> restoring opentelemetry-proto $version over the copy xds-protos installed"
  .venv/bin/pip install -q --force-reinstall --no-deps "opentelemetry-proto==$version" >> .venv/pip.log 2>&1
fi
if [ "${1:-}" = "--test-deps" ]; then
  # the dashboard's browser tests; the shared rate-limit tests (a real redis-server)
  bash scripts/debian-packages.sh chromium chromium-driver redis-server
fi
