"""Where the CLI looks by default: polar's cache (tokenizer, venvs, demo runs)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))
DEFAULT_TOKENIZER = DEFAULT_CACHE / "models" / "qwen35-tiny"
