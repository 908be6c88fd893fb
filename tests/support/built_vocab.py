"""A real vocabulary a registry package embeds, as a tokenizer directory in the cache: built once by a scripts/ builder
(run by the Python that has the package: the suite's vLLM venv by default) and checked there against the package's own
encoder. Never committed."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.conftest import CACHE, REPO
from tests.support.real_vllm import require_vllm_venv


def built_vocab(name: str, builder: str, python: Callable[[], Path | str] = require_vllm_venv) -> Path:
    """`$POLAR_CACHE/models/NAME`, made by `PYTHON scripts/BUILDER --out` (into a partial folder first: a crash leaves
    none), by one test worker at a time (the others wait on the lock, then find it built)."""
    out = CACHE / "models" / name
    if (out / "tokenizer.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "tokenizer.json").is_file():
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            subprocess.run([str(python()), str(REPO / "scripts" / builder), "--out", str(partial)], check=True,
                           timeout=900)
            partial.rename(out)
    return out
