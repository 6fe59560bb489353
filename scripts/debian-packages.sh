#!/usr/bin/env bash
# Install Debian packages that tests need, only the missing ones: `apt-get update` once, then `apt-get install -y`.
# Quiet when everything is already installed. A failed install only warns: the tests that need the package then
# skip and say why (e.g. the browser tests without chromium).
#   bash scripts/debian-packages.sh chromium chromium-driver
set -uo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
  echo "warning: cannot install ${missing[*]} (needs apt-get as root); tests that need them will skip" >&2
  exit 0
fi
echo "==> installing Debian packages: ${missing[*]} (once)"
log=$(mktemp)
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "warning: installing ${missing[*]} failed (log above); tests that need them will skip" >&2
fi
rm -f "$log"
exit 0
