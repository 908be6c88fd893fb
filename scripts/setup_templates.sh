#!/usr/bin/env bash
# The real chat templates of ~70 model families, from the llama-cpp-python sdist (it vendors llama.cpp's
# template test corpus, copied from each model's own tokenizer_config.json / chat_template.jinja), into
# $POLAR_CACHE/templates. Idempotent: done once, then only checked. Never committed.
set -euo pipefail
VERSION=0.3.36
CACHE="${POLAR_CACHE:-$HOME/.cache/polar}"
DEST="$CACHE/templates"
STAMP="$DEST/.llama-cpp-python-$VERSION"
if [ -f "$STAMP" ]; then
  echo "setup_templates: $(ls "$DEST"/*.jinja | wc -l) templates in $DEST"
  exit 0
fi
PY="$(command -v python3)"  # any Python with pip (scripts/test: the venv's, first on PATH)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "setup_templates: downloading the llama-cpp-python $VERSION sdist (~77 MB, once)"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  "llama-cpp-python==$VERSION" -d "$WORK" 2>&1 | grep -v "^WARNING: Location" || true
tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK" --wildcards '*/vendor/llama.cpp/models/templates/*.jinja'
mkdir -p "$DEST"
cp "$WORK"/llama_cpp_python-"$VERSION"/vendor/llama.cpp/models/templates/*.jinja "$DEST/"
touch "$STAMP"
echo "setup_templates: $(ls "$DEST"/*.jinja | wc -l) templates in $DEST"
