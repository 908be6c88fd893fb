#!/usr/bin/env bash
# Debian's haproxy: the front of `polar proxy --workers N` (one address, each session on one worker).
# Idempotent; needs root to install. The package's own service is not started: polar runs haproxy itself.
set -euo pipefail
if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then
  echo "setup_haproxy: $(PATH="$PATH:/usr/sbin" haproxy -v 2>/dev/null | head -1)"
  exit 0
fi
echo "setup_haproxy: installing haproxy"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends haproxy >/dev/null
echo "setup_haproxy: $(PATH="$PATH:/usr/sbin" haproxy -v 2>/dev/null | head -1)"
