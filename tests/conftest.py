"""Shared fixtures: the real tokenizer, the scripted vLLM double, and a running polar proxy."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CACHE = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """The real Qwen3.5 vocabulary as a HF tokenizer dir, built on demand (never committed)."""
    path = Path(os.environ.get("POLAR_TOKENIZER", CACHE / "models" / "qwen35-tiny"))
    if not (path / "tokenizer.json").exists():
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "build_tiny_model.py"), "--tokenizer-only", "--out", str(path)],
            check=True,
        )
    return path


@pytest.fixture(scope="session")
def shared_templates() -> Path:
    path = SHARED / "reference" / "templates"
    if not path.is_dir():
        pytest.skip("../shared/reference/templates is absent (a fresh clone has none)")
    return path


@dataclass
class Stack:
    """polar (reverse mode) in front of the scripted vLLM double, both in-process."""

    url: str
    upstream_url: str
    db: Path
    double: object
    proxy: object

    def script(self, steps=None, rules=None) -> None:
        body = {"rules": rules} if rules is not None else {"steps": steps}
        httpx.post(f"{self.upstream_url}/_double/script", json=body).raise_for_status()

    def fault(self, **fault) -> None:
        httpx.post(f"{self.upstream_url}/_double/fault", json=fault).raise_for_status()

    def store(self):
        return self.proxy.addon.gateway.store

    def row(self, call_id: str) -> dict:
        rows = [r for r in self.store().calls() if r["call_id"] == call_id]
        assert rows, f"no capture row for call {call_id}"
        return rows[0]

    def rows(self, session: str | None = None) -> list[dict]:
        return list(self.store().calls(session=session))


@pytest.fixture(scope="session")
def stack(tokenizer_dir, tmp_path_factory):
    from polar.doubles.scripted_vllm import BackgroundServer, ScriptedVLLM
    from polar.proxy import BackgroundProxy, ProxyConfig, free_port

    double = ScriptedVLLM(tokenizer_dir, "polar-tiny", max_model_len=32768)
    upstream = BackgroundServer(double.app)
    upstream_url = upstream.start()
    db = tmp_path_factory.mktemp("captures") / "captures.db"
    proxy = BackgroundProxy(ProxyConfig(upstream=upstream_url, db=str(db), port=free_port(),
                                        extra={"polar_upstream_timeout": 3.0}))
    proxy.start()
    yield Stack(proxy.url, upstream_url, db, double, proxy)
    proxy.stop()
    upstream.stop()


@pytest.fixture(autouse=True)
def _reset_double(request):
    """Each test starts with no script and no fault on the shared double."""
    yield
    if "stack" in request.fixturenames:
        stack = request.getfixturevalue("stack")
        stack.script(rules=[])
        stack.fault(count=0)
