# Sourced by the set-up scripts: `find_python 3.12` prints a Python interpreter of at least that
# version (POLAR_PYTHON first, then PATH, then pyenv's versions), or fails.
find_python() {
  local want="${1:-3.12}" cand
  local minor="${want#3.}"
  for cand in "${POLAR_PYTHON:-}" python3.14 python3.13 python3.12 python3.11 \
              "$HOME"/.pyenv/versions/3.1[1-9]*/bin/python /usr/local/bin/python3 /usr/bin/python3 python3; do
    [ -n "$cand" ] || continue
    command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
    if "$cand" -c "import sys; sys.exit(0 if sys.version_info >= (3, $minor) else 1)" 2>/dev/null; then
      command -v "$cand" 2>/dev/null || echo "$cand"; return 0
    fi
  done
  return 1
}
