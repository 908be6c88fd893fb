"""Scripted vLLM doubles as processes of their own, to stand for a fleet's replicas: one can be killed
outright (SIGKILL: connections reset mid-answer, as a crashed server's) and started again on its port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from polar.mitm.proxy import die_with_parent, free_port


class DoubleProcess:
    """`polar double` on a port of its own (a TEST DOUBLE of a vLLM server: see polar/doubles/server.py)."""

    def __init__(self, tokenizer_dir: Path, port: int | None = None, token_delay: float = 0.0):
        self.tokenizer_dir, self.port, self.token_delay = tokenizer_dir, port or free_port(), token_delay
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        cmd = [sys.executable, "-m", "polar.cli", "double", "--tokenizer", str(self.tokenizer_dir),
               "--port", str(self.port), "--token-delay", str(self.token_delay)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     preexec_fn=die_with_parent)

    def wait_ready(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, "the double exited"
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the double on {self.url} did not start")

    def kill(self) -> None:
        """As a crash: SIGKILL, no goodbye to any client."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def requests(self) -> list[dict]:
        return httpx.get(f"{self.url}/_double/requests", timeout=10).json()

    def post(self, what: str, body: dict) -> None:
        httpx.post(f"{self.url}/_double/{what}", json=body, timeout=10).raise_for_status()


class InProcessDouble:
    """The double in this process (cheaper to start than a process; it cannot be killed as one)."""

    def __init__(self, tokenizer_dir: Path | None = None, url: str | None = None):
        """A new one, or (`url`) one already running, as the suite's shared `double_server`."""
        from polar.doubles.scripted_vllm import BackgroundServer, ScriptedVLLM

        self.server = None if url else BackgroundServer(ScriptedVLLM(tokenizer_dir, "polar-tiny").app)
        self.url = url or self.server.start()

    def post(self, what: str, body: dict) -> None:
        httpx.post(f"{self.url}/_double/{what}", json=body, timeout=10).raise_for_status()

    def kill(self) -> None:
        if self.server is not None:  # (a shared one is left running)
            self.server.stop()
