#!/usr/bin/env bash
# tools/install_browser.sh: install Debian's chromium for the real-browser notebook test.
# Idempotent and quiet: does nothing when /usr/bin/chromium exists. Playwright drives this
# system browser (never `playwright install`, which downloads its own and fails offline).
set -euo pipefail
if [[ -x /usr/bin/chromium ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_browser.sh: no apt-get here; install Chromium yourself at /usr/bin/chromium" \
       "(the browser test is skipped without it)" >&2
  exit 1
fi
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then sudo=(sudo); else
    echo "install_browser.sh: run as root (or install sudo) to apt-get install chromium" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >/dev/null
"${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
test -x /usr/bin/chromium
echo "installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
