"""Mistral's real vocabulary (mistral-common's tekken file) as a tokenizer directory in the cache, `[ARGS]` and
`[CALL_ID]` stand-ins in two free control-token slots: built once by scripts/build_tekken_vocab.py in the suite's vLLM
venv (which has mistral-common), and checked there against mistral-common's own encoder. Never committed."""

from __future__ import annotations

from pathlib import Path

from tests.support.built_vocab import built_vocab


def tekken_vocab_dir() -> Path:
    return built_vocab("mistral-tekken-vocab", "build_tekken_vocab.py")
