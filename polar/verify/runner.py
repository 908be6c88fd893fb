"""The worker process that recomputes logprobs (worker.py), under a Python that has torch and transformers.

Which Python: the one named (`--python`, else POLAR_VERIFY_PYTHON), else polar's own when torch imports
in it (`pip install 'polar[verify]'`). The worker always runs as a child process: torch's threads and memory
stay out of polar's process, and the weights load once for the whole run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from polar.verify.errors import VerifyError

WORKER = Path(__file__).with_name("worker.py")
PYTHON_ENV = "POLAR_VERIFY_PYTHON"
DTYPES = ("float32", "bfloat16", "float16", "auto")


def find_python(explicit: str | None = None) -> str:
    """The interpreter the worker runs under (see the module docstring)."""
    named = explicit or os.environ.get(PYTHON_ENV)
    if named:
        path = shutil.which(named) or named
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise VerifyError(f"no Python at {named} (--python / {PYTHON_ENV})")
        return path
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        return sys.executable
    raise VerifyError(
        "this Python has no torch: install polar's extra (pip install 'polar[verify]'), or name a Python that has "
        f"torch and transformers with --python PATH or {PYTHON_ENV} (e.g. the vLLM venv's bin/python)")


def check_model_dir(model: str | Path) -> Path:
    """A local Hugging Face checkpoint directory (verify never downloads: it must be the served weights)."""
    path = Path(model)
    if not (path / "config.json").is_file():
        raise VerifyError(f"{model} is not a model directory (no config.json): give the weights vLLM serves")
    return path


class Worker:
    """One worker process: `logprobs(ids, positions)` per trajectory; a context manager that stops it."""

    def __init__(self, model: str | Path, python: str | None = None, dtype: str = "float32", device: str = "auto",
                 chunk: int = 1024):
        if dtype not in DTYPES:
            raise VerifyError(f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")
        self.model = check_model_dir(model)
        self.python = find_python(python)
        self._log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # the worker's stderr
        env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # the weights are local: never a hub
        env.pop("PYTHONPATH", None)  # another venv's Python must not import polar's environment
        try:
            self._proc = subprocess.Popen(
                [self.python, str(WORKER), "--model", str(self.model), "--dtype", dtype, "--device", device,
                 "--chunk", str(chunk)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, encoding="utf-8", env=env,
            )  # fmt: skip
        except OSError as exc:
            self._log.close()
            raise VerifyError(f"cannot run {self.python}: {exc}") from None
        ready = self._receive()
        if "error" in ready:
            self.close()
            raise VerifyError(f"cannot load {self.model} under {self.python}: {ready['error']}")
        self.info: dict[str, Any] = ready

    @property
    def vocab_size(self) -> int:
        return int(self.info["vocab_size"])

    def logprobs(self, ids: list[int], positions: list[int]) -> list[float | None]:
        """The model's logprob of ids[p] given ids[:p], for each p in `positions`."""
        try:
            self._proc.stdin.write(json.dumps({"ids": ids, "positions": positions}) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise VerifyError(f"the verify worker died{self._tail()}") from None
        answer = self._receive()
        if "error" in answer:
            raise VerifyError(f"the verify worker refused a trajectory: {answer['error']}")
        return answer["logprobs"]

    def _receive(self) -> dict[str, Any]:
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise VerifyError(f"the verify worker ({self.python}) exited with {code}{self._tail()}")
        try:
            return json.loads(line)
        except ValueError:
            raise VerifyError(f"the verify worker wrote {line[:200]!r}, not its protocol") from None

    def _tail(self, lines: int = 15) -> str:
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().strip().splitlines()[-lines:]
        return (":\n" + "\n".join(text)) if text else ""

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
