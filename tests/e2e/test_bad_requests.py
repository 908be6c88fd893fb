"""A corpus of bad requests and upstream failures, through a running polar.

Every case must get the caller's own provider error shape and a sensible status, never crash
the proxy, and leave a capture row that records the failure.
"""

from __future__ import annotations

import json

import httpx
import pytest

from polar.capture.reader import CaptureReader
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port

PATHS = {
    "anthropic": "/v1/messages",
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
    "gemini": "/v1beta/models/gemini-2.5-pro:generateContent",
}
HEADERS = {
    "anthropic": {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"},
    "openai_chat": {"authorization": "Bearer sk"},
    "openai_responses": {"authorization": "Bearer sk"},
    "gemini": {"x-goog-api-key": "gm"},
}
GOOD = {
    "anthropic": {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    "openai_chat": {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]},
    "openai_responses": {"model": "gpt-x", "input": "hi"},
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
}
WRONG_TYPES = {
    "anthropic": {"model": "claude-x", "max_tokens": "many", "messages": [{"role": "user", "content": 5}]},
    "openai_chat": {"model": "gpt-x", "messages": "hi", "temperature": "hot"},
    "openai_responses": {"model": "gpt-x", "input": 42},
    "gemini": {"contents": [{"role": "user", "parts": "hi"}]},
}
MISSING = {
    "anthropic": {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]},  # no max_tokens
    "openai_chat": {"model": "gpt-x"},
    "openai_responses": {"model": "gpt-x"},
    "gemini": {},
}


def error_message(provider: str, body: dict) -> str:
    """The message inside the provider's own error object (asserting the shape on the way)."""
    if provider == "anthropic":
        assert body["type"] == "error" and isinstance(body["error"]["type"], str)
        return body["error"]["message"]
    if provider == "gemini":
        err = body["error"]
        assert isinstance(err["code"], int) and isinstance(err["status"], str)
        return err["message"]
    assert isinstance(body["error"]["type"], str)
    return body["error"]["message"]


def post(url: str, provider: str, content: bytes | dict, path: str | None = None) -> httpx.Response:
    data = json.dumps(content).encode() if isinstance(content, dict) else content
    headers = {**HEADERS[provider], "content-type": "application/json"}
    return httpx.post(url + (path or PATHS[provider]), content=data, headers=headers, timeout=60)


def check(stack, resp: httpx.Response, provider: str, status: int | tuple, kind: str, says: str = "") -> None:
    statuses = status if isinstance(status, tuple) else (status,)
    assert resp.status_code in statuses, (resp.status_code, resp.text[:300])
    message = error_message(provider, resp.json())
    assert message and says.lower() in message.lower(), message
    row = stack.row(resp.headers["x-polar-call-id"])
    assert row["status"] == "error" and row["error_kind"] == kind and row["http_status"] == resp.status_code
    assert row["error"] and row["provider"] == provider


@pytest.fixture(params=list(PATHS))
def provider(request):
    return request.param


def test_malformed_json(stack, provider):
    check(stack, post(stack.url, provider, b'{"model": "x", "messages": ['), provider, 400, "invalid_request", "json")


def test_wrong_types(stack, provider):
    check(stack, post(stack.url, provider, WRONG_TYPES[provider]), provider, 400, "invalid_request")


def test_missing_fields(stack, provider):
    check(stack, post(stack.url, provider, MISSING[provider]), provider, 400, "invalid_request")


def test_body_not_an_object(stack, provider):
    check(stack, post(stack.url, provider, b'["a", 1]'), provider, 400, "invalid_request")


def test_huge_body(stack, provider):
    body = b'{"pad": "' + b"x" * (65 * 1024 * 1024) + b'"}'
    check(stack, post(stack.url, provider, body), provider, (413, 400), "too_large", "bytes")
    row = stack.rows()[-1]
    assert len(row["request_body"]) < 9 * 1024 * 1024  # stored truncated, still recorded


def test_unknown_path(stack, provider):
    path = {"anthropic": "/v1/messages/nope", "openai_chat": "/v1/chat/nope", "openai_responses": "/v1/responses/x/y",
            "gemini": "/v1beta/models/gemini-2.5-pro:embedThings"}[provider]
    check(stack, post(stack.url, provider, GOOD[provider], path), provider, 404, "not_found", "does not serve")


def test_context_too_long(stack, provider):
    body = json.loads(json.dumps(GOOD[provider]).replace('"hi"', json.dumps("lorem ipsum " * 20000)))
    check(stack, post(stack.url, provider, body), provider, 400, "context_length")


@pytest.mark.parametrize(
    "fault,kind,statuses",
    [
        ({"mode": "status", "status": 500}, "upstream_error", (500, 502)),
        ({"mode": "status", "status": 503}, "upstream_unavailable", (503, 529)),
        ({"mode": "garbage"}, "upstream_error", (500, 502)),
        ({"mode": "reset"}, "upstream_error", (500, 502)),
    ],
    ids=["500", "503", "garbage", "reset"],
)
def test_upstream_faults(stack, provider, fault, kind, statuses):
    stack.fault(count=1, **fault)
    check(stack, post(stack.url, provider, GOOD[provider]), provider, statuses, kind)
    ok = post(stack.url, provider, GOOD[provider])  # the proxy keeps serving
    assert ok.status_code == 200, ok.text[:300]


def test_upstream_timeout(double_server, provider, tmp_path):
    """A proxy with a 2 s upstream timeout in front of an upstream that does not answer."""
    _, upstream = double_server
    db = tmp_path / "captures.db"
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(),
                                        extra={"polar_upstream_timeout": "2"}))
    proxy.start()
    try:
        httpx.post(f"{upstream}/_double/fault", json={"mode": "timeout", "seconds": 30, "count": 1}).raise_for_status()
        resp = post(proxy.url, provider, GOOD[provider])
        assert resp.status_code == 504 and error_message(provider, resp.json())
        row = next(r for r in CaptureReader(db).calls() if r["call_id"] == resp.headers["x-polar-call-id"])
        assert row["status"] == "error" and row["error_kind"] == "upstream_timeout"
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def dead_upstream_stack(stack, tmp_path_factory):
    """polar pointed at a port nobody listens on."""
    db = tmp_path_factory.mktemp("dead") / "captures.db"
    proxy = SubprocessProxy(ProxyConfig(upstream=f"http://127.0.0.1:{free_port()}", db=str(db), port=free_port(),
                                        upstream_model="polar-tiny"))
    proxy.start()

    class Dead:
        url = proxy.url

        @staticmethod
        def row(call_id):
            return next(r for r in CaptureReader(db).calls() if r["call_id"] == call_id)

    yield Dead()
    proxy.stop()


def test_upstream_down(dead_upstream_stack, provider):
    resp = post(dead_upstream_stack.url, provider, GOOD[provider])
    check(dead_upstream_stack, resp, provider, (503, 529), "upstream_unavailable", "connect")


def test_side_calls(stack):
    assert httpx.head(stack.url + "/").status_code == 200
    models = httpx.get(stack.url + "/v1/models", headers={"authorization": "Bearer k"}).json()
    assert models["data"][0]["id"] == "polar-tiny"
    anthropic_models = httpx.get(stack.url + "/v1/models", headers=HEADERS["anthropic"]).json()
    assert anthropic_models["data"][0]["type"] == "model"
    gemini_models = httpx.get(stack.url + "/v1beta/models", headers=HEADERS["gemini"]).json()
    assert gemini_models["models"][0]["name"] == "models/polar-tiny"
    ws = httpx.get(stack.url + "/v1/responses", headers={"upgrade": "websocket", "connection": "Upgrade",
                                                        "authorization": "Bearer k"})
    assert ws.status_code == 426 and "websocket" in ws.json()["error"]["message"].lower()


def test_secret_never_stored_or_forwarded(stack):
    stack.script(steps=[{"content": "ok"}])
    httpx.delete(f"{stack.upstream_url}/_double/requests")
    resp = post(stack.url, "anthropic", GOOD["anthropic"])
    assert resp.status_code == 200
    raw = stack.db.read_bytes() + (stack.db.with_name(stack.db.name + "-wal").read_bytes()
                                   if stack.db.with_name(stack.db.name + "-wal").exists() else b"")
    assert b"sk-ant" not in raw
    assert "sk-ant" not in json.dumps(httpx.get(f"{stack.upstream_url}/_double/requests").json())
