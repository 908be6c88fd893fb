"""gpt-oss's real vocabulary, o200k_harmony, as a tokenizer directory in the cache: built once by
scripts/build_harmony_vocab.py from the `openai-harmony` package in the suite's vLLM venv (which has it), and checked
there against that package's own encoder. Never committed."""

from __future__ import annotations

from pathlib import Path

from tests.support.built_vocab import built_vocab


def harmony_vocab_dir() -> Path:
    return built_vocab("gpt-oss-vocab", "build_harmony_vocab.py")
