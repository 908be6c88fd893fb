#!/usr/bin/env bash
# Debian's Chromium for the browser tests (mitmweb's polar view, `polar report` rendered to an image).
# Playwright drives it through its executable path: no browser download. Idempotent; needs root.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  echo "setup_browser: $(chromium --version 2>/dev/null | head -1)"
  exit 0
fi
echo "setup_browser: installing chromium"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "setup_browser: $(chromium --version 2>/dev/null | head -1)"
