"""HTTP hygiene through a running polar, each case on a keep-alive connection whose next request must work.

HEAD gets headers only; nesting, body size, methods and content types polar does not take get a 4xx in
the caller's provider shape (405 with `Allow`), never a 5xx, and never a connection left unusable.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket

import pytest

from tests.e2e.test_bad_requests import GOOD, HEADERS, PATHS, error_message


class Conn:
    """One HTTP/1.1 connection to polar; every answer is followed by a `GET /` on the same socket."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").split(":")
        self.http = http.client.HTTPConnection(host, int(port), timeout=60)

    def send(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        self.http.request(method, path, body=body or None, headers=headers or {})
        resp = self.http.getresponse()
        data = resp.read()
        sock = self.http.sock
        self.http.request("GET", "/")
        follow = self.http.getresponse()
        assert (follow.status, follow.read()) == (200, b"polar gateway\n")
        assert self.http.sock is sock and not resp.will_close  # the very same connection, still open
        return resp, data


@pytest.fixture
def conn(stack):
    c = Conn(stack.url)
    yield c
    c.http.close()


def json_headers(provider: str, content_type: str = "application/json") -> dict:
    return {**HEADERS[provider], "content-type": content_type}


@pytest.mark.parametrize("path", ["/", "/v1/models", "/v1beta/models", "/nope", "/v1/messages", "/v1/chat/completions",
                                  "/v1/responses", PATHS["gemini"]])
def test_head_is_get_without_a_body(conn, path):
    get, get_body = conn.send("GET", path, headers={"authorization": "Bearer k"})
    head, head_body = conn.send("HEAD", path, headers={"authorization": "Bearer k"})
    assert head.status == get.status and head_body == b""
    assert head.getheader("content-length") == str(len(get_body))
    assert head.getheader("content-type") == get.getheader("content-type")


def test_head_answers_are_bare_on_the_wire(stack):
    """Pipelined on one raw socket: each HEAD answer's blank line is followed directly by the next status line."""
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"HEAD /v1/nope HTTP/1.1\r\nHost: p\r\n\r\n"
                     b"HEAD /v1/messages HTTP/1.1\r\nHost: p\r\nx-api-key: k\r\n\r\n"
                     b"GET / HTTP/1.1\r\nHost: p\r\n\r\n")
        data = b""
        while not data.endswith(b"polar gateway\n"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    heads = data.split(b"\r\n\r\n")
    assert len(heads) == 4 and heads[-1] == b"polar gateway\n", data
    assert [h.split(b"\r\n")[0] for h in heads[:3]] == [b"HTTP/1.1 404 Not Found", b"HTTP/1.1 405 Method Not Allowed",
                                                         b"HTTP/1.1 200 OK"]


def test_nested_too_deep(stack, conn, provider):
    deep_array = b"[" * 5000 + b"]" * 5000
    deep_object = b'{"a":' * 5000 + b"1" + b"}" * 5000
    just_over = json.dumps(GOOD[provider] | {"extra": "NEST"}).replace('"NEST"', "[" * 128 + "]" * 128).encode()
    for body in (deep_array, deep_object, just_over):
        resp, data = conn.send("POST", PATHS[provider], body, json_headers(provider))
        assert resp.status == 400, data[:300]
        assert "nests json too deeply" in error_message(provider, json.loads(data)).lower()
        row = stack.row(resp.getheader("x-polar-call-id"))
        assert row["status"] == "error" and row["error_kind"] == "invalid_request"


def test_nesting_within_the_limit_is_served(stack, conn):
    """Tool arguments nested 100 levels deep are a valid request: answered, not refused or crashed."""
    stack.script(rules=[{"match": "", "steps": [{"content": "ok"}]}])
    args = {"city": "x"}
    for _ in range(100):
        args = {"a": args}
    body = json.loads(json.dumps(GOOD["anthropic"]))
    body["messages"] += [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": args}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}]},
    ]
    resp, data = conn.send("POST", PATHS["anthropic"], json.dumps(body).encode(), json_headers("anthropic"))
    assert resp.status == 200, data[:300]


def test_unpaired_surrogate_is_a_client_error(conn, provider):
    body = json.dumps(GOOD[provider]).replace('"hi"', '"hi \\ud83d"').encode()
    resp, data = conn.send("POST", PATHS[provider], body, json_headers(provider))
    assert resp.status == 400 and "surrogate" in error_message(provider, json.loads(data))


@pytest.fixture
def small_body_limit(stack):
    """polar_max_body lowered to 4 KiB for one test (set on the proxy's own loop, as mitmproxy expects)."""
    def set_limit(value: int) -> None:
        async def update():
            stack.proxy.master.options.update(polar_max_body=value)

        asyncio.run_coroutine_threadsafe(update(), stack.proxy.master.event_loop).result(10)

    set_limit(4096)
    yield
    set_limit(64 * 1024 * 1024)


def test_body_too_large(conn, provider, small_body_limit):
    body = json.dumps(GOOD[provider] | {"pad": "x" * 5000}).encode()
    resp, data = conn.send("POST", PATHS[provider], body, json_headers(provider))
    assert resp.status == (400 if provider == "gemini" else 413), data[:300]  # each API's documented status
    assert "bytes" in error_message(provider, json.loads(data))


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "GET"])
def test_methods_not_served_on_model_endpoints(conn, provider, method):
    body = json.dumps(GOOD[provider]).encode() if method in ("PUT", "PATCH") else b""
    resp, data = conn.send(method, PATHS[provider], body, json_headers(provider))
    assert resp.status == 405 and resp.getheader("allow") == "POST, OPTIONS"
    assert method in error_message(provider, json.loads(data))
    assert resp.getheader("x-polar-call-id") is None  # not a model call: nothing captured


def test_options_and_side_path_methods(conn, provider):
    resp, data = conn.send("OPTIONS", PATHS[provider], headers=HEADERS[provider])
    assert (resp.status, data, resp.getheader("allow")) == (204, b"", "POST, OPTIONS")
    assert resp.getheader("content-length") is None  # a 204 carries none
    resp, data = conn.send("POST", "/v1/models", b"{}", json_headers(provider))
    assert resp.status == 405 and resp.getheader("allow") == "GET, HEAD, OPTIONS"
    assert "POST" in error_message(provider, json.loads(data))


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/octet-stream"])
def test_wrong_content_type(stack, conn, provider, content_type):
    resp, data = conn.send("POST", PATHS[provider], json.dumps(GOOD[provider]).encode(), json_headers(provider, content_type))
    assert resp.status == 415, data[:300]
    assert "application/json" in error_message(provider, json.loads(data))
    assert stack.row(resp.getheader("x-polar-call-id"))["error_kind"] == "invalid_request"


def test_binary_body(conn, provider):
    resp, data = conn.send("POST", PATHS[provider], bytes(range(256)) * 4, json_headers(provider))
    assert resp.status == 400 and "not valid json" in error_message(provider, json.loads(data)).lower()


def test_json_without_a_content_type_is_served(stack, conn):
    stack.script(rules=[{"match": "", "steps": [{"content": "ok"}]}])
    resp, data = conn.send("POST", PATHS["openai_chat"], json.dumps(GOOD["openai_chat"]).encode(), HEADERS["openai_chat"])
    assert resp.status == 200, data[:300]


@pytest.fixture(params=list(PATHS))
def provider(request):
    return request.param
