"""A real vocabulary a registry package embeds, as a tokenizer directory in the cache: built once by a scripts/ builder
(run by the Python that has the package: the suite's vLLM venv by default) and checked there against the package's own
encoder. Never committed."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CACHE, REPO
from tests.support.real_vllm import require_vllm_venv


def built_vocab(name: str, builder: str, python: Callable[[], Path | str] = require_vllm_venv) -> Path:
    """`$POLAR_CACHE/models/NAME`, made by `PYTHON scripts/BUILDER --out` into a folder of its own first and renamed
    into place (a crash leaves none; a test worker that loses the race to another keeps the other's)."""
    out = CACHE / "models" / name
    if not (out / "tokenizer.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{name}.", suffix=".partial", dir=out.parent))
        try:
            subprocess.run([str(python()), str(REPO / "scripts" / builder), "--out", str(work / name)], check=True,
                           timeout=900)
            try:
                (work / name).rename(out)
            except OSError:
                if not (out / "tokenizer.json").is_file():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out
