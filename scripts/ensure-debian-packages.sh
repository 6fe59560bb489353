#!/usr/bin/env bash
# Install the Debian packages named on the command line when they are missing; silent when all are present.
# `apt-get update` runs at most once per call, and only when something must be installed. Used by bootstrap.sh
# for the packages real-component tests need (e.g. redis-server).
#   usage: bash scripts/ensure-debian-packages.sh PACKAGE...
set -euo pipefail
missing=()
for pkg in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing Debian packages (${missing[*]}) and no apt-get to install them" >&2
  exit 1
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=(sudo -n); else
    echo "error: missing Debian packages (${missing[*]}); run as root or install them" >&2
    exit 1
  fi
fi
echo "==> installing Debian packages: ${missing[*]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! { "${SUDO[@]}" apt-get update -q && "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    >"$log" 2>&1; then
  cat "$log" >&2
  echo "error: installing ${missing[*]} failed (log above)" >&2
  exit 1
fi
