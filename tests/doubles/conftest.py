"""The scripted vLLM double on its own (no polar, no vLLM): one server per test module, and a stream reader."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx
import pytest


@dataclass
class Streamed:
    """One SSE answer as it arrived: each event's JSON (None for [DONE]) and its arrival time."""

    events: list[dict | None] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    started: float = 0.0

    @property
    def chunks(self) -> list[dict]:
        return [e for e in self.events if e is not None]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] is None


def read_stream(client: httpx.Client, path: str, body: dict) -> Streamed:
    out = Streamed(started=time.monotonic())
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        for line in response.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            out.events.append(None if line == "data: [DONE]" else json.loads(line[6:]))
            out.times.append(time.monotonic())
    return out


@pytest.fixture(scope="module")
def double(tokenizer_dir):
    """(the ScriptedVLLM, a client on its URL); pace, script, fault and template are reset after each test."""
    from polar.doubles.scripted_vllm import BackgroundServer, ScriptedVLLM

    vllm = ScriptedVLLM(tokenizer_dir, "polar-tiny", max_model_len=32768)
    server = BackgroundServer(vllm.app)
    url = server.start()
    with httpx.Client(base_url=url, timeout=60) as client:
        yield vllm, client
    server.stop()


@pytest.fixture(autouse=True)
def _reset(request):
    yield
    if "double" in request.fixturenames:
        _, client = request.getfixturevalue("double")
        client.post("/_double/pace", json={"token_delay_s": 0, "first_token_delay_s": 0}).raise_for_status()
        client.post("/_double/script", json={"rules": []}).raise_for_status()
        client.post("/_double/fault", json={"count": 0}).raise_for_status()
        client.post("/_double/template", json={"chat_template": None}).raise_for_status()
