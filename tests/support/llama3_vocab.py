"""Llama-3's real vocabulary (Llama-3.3's) as a tokenizer directory in the cache: built once by
scripts/build_llama3_vocab.py from Meta's `llama-models` package (a dev dependency: this Python has it), and checked
there against that package's own encoder and llama.cpp's published ids. Never committed."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.built_vocab import built_vocab


def llama3_vocab_dir() -> Path:
    return built_vocab("llama3-vocab", "build_llama3_vocab.py", lambda: sys.executable)
