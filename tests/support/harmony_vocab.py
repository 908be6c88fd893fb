"""gpt-oss's real vocabulary, o200k_harmony, as a tokenizer directory in the cache: built once by
scripts/build_harmony_vocab.py from the `openai-harmony` package in the suite's vLLM venv (which has it), and checked
there against that package's own encoder. Never committed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import CACHE, REPO
from tests.support.real_vllm import require_vllm_venv


def harmony_vocab_dir() -> Path:
    out = CACHE / "models" / "gpt-oss-vocab"
    if not (out / "tokenizer.json").is_file():
        python = require_vllm_venv()
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([str(python), str(REPO / "scripts" / "build_harmony_vocab.py"), "--out", str(partial)],
                       check=True, timeout=900)
        partial.rename(out)
    return out
