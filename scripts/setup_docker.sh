#!/usr/bin/env bash
# Makes a Docker engine available for polar's container runtime and its tests. Idempotent:
#   - installs docker.io (engine) and debootstrap (base images) with apt-get when missing;
#   - starts dockerd in the background when no engine answers, logs in ${POLAR_CACHE}/dockerd.log;
#   - waits until the engine answers (or fails with the log's tail).
# Needs root. Machines with an engine already running (systemd, Docker Desktop) are left alone.
set -euo pipefail
POLAR_CACHE="${POLAR_CACHE:-$HOME/.cache/polar}"
LOG="$POLAR_CACHE/dockerd.log"
WAIT="${POLAR_DOCKER_WAIT:-60}"
mkdir -p "$POLAR_CACHE"

engine_up() { docker info >/dev/null 2>&1; }

if engine_up; then
  echo "setup_docker: engine already running"
  exit 0
fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup_docker: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" iptables ca-certificates >/dev/null
fi

# A stale pid file from a dead daemon makes dockerd refuse to start.
if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
  rm -f /var/run/docker.pid
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  echo "setup_docker: starting dockerd (log: $LOG)"
  # setsid: the daemon outlives this script and the shell that ran it.
  setsid dockerd >>"$LOG" 2>&1 </dev/null &
fi

for _ in $(seq "$WAIT"); do
  if engine_up; then
    echo "setup_docker: engine ready ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
  fi
  sleep 1
done
echo "setup_docker: dockerd did not answer within ${WAIT}s; last log lines:" >&2
tail -n 30 "$LOG" >&2 || true
exit 1
