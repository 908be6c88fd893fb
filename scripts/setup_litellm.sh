#!/usr/bin/env bash
# Install the LiteLLM proxy (a peer benchmarked by scripts/bench_peers.py) into its own venv,
# ${POLAR_CACHE:-~/.cache/polar}/litellm-venv: it pins many packages that must not meet polar's.
# Pinned below the releases that need a certifi newer than the package index offers here.
# Idempotent: does nothing when that venv already runs the pinned version's proxy.
#
#   scripts/setup_litellm.sh          # prints the venv's python on its last line
set -euo pipefail

LITELLM_VERSION=1.102.4
cache="${POLAR_CACHE:-$HOME/.cache/polar}"
venv="$cache/litellm-venv"

source "$(dirname "${BASH_SOURCE[0]}")/find_python.sh"  # the proxy extras support 3.12+

# A working install: the pinned distribution is there and the proxy's server module imports.
litellm_ready() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$LITELLM_VERSION" <<'EOF' >/dev/null 2>&1
import importlib.metadata, sys
assert importlib.metadata.version("litellm") == sys.argv[1]
import litellm.proxy.proxy_server  # noqa: F401  (fails when the [proxy] extras are missing)
EOF
}

if litellm_ready; then
  echo "litellm $LITELLM_VERSION already installed in $venv"
  echo "$venv/bin/python"
  exit 0
fi

started=$SECONDS
if [ ! -x "$venv/bin/python" ]; then
  python="$(find_python 3.12)" || { echo "no Python >= 3.12 found (PATH, ~/.pyenv); set POLAR_PYTHON" >&2; exit 1; }
  echo "creating $venv with $python"
  mkdir -p "$cache"
  "$python" -m venv "$venv"
fi
echo "installing litellm[proxy]==$LITELLM_VERSION (a minute or two)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION" 2>&1 \
  | grep -v "^WARNING: Location" || true

if ! litellm_ready; then
  echo "litellm installed but its proxy does not import in $venv:" >&2
  "$venv/bin/python" -c 'import litellm.proxy.proxy_server' >&2 || true
  exit 1
fi
echo "installed litellm $LITELLM_VERSION in $venv ($((SECONDS - started))s)"
echo "$venv/bin/python"
