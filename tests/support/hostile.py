"""Hostile HTTP requests against polar, and the judge of its answers, over one keep-alive connection.

One seeded generator (`probe(rng)`) serves both the fuzz test (hypothesis hands it a `Random`) and
`scripts/fuzz_gateway.py` (a `Random(seed)`): mutated and deeply nested JSON, methods polar does not
serve (HEAD included), binary bodies, wrong content types, unknown paths. `KeepAlive` sends each on
the same connection, so a stray body byte or a dropped connection shows up on the next request.
"""

from __future__ import annotations

import http.client
import json
import random
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tests.support.fuzz import drop, paths, replace

TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

# One rich, valid request per API: the mutations start from something every feature of which parses.
VALID: dict[str, tuple[str, dict[str, Any]]] = {
    "anthropic": ("/v1/messages", {
        "model": "claude-x", "max_tokens": 32, "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "get_weather", "description": "w", "input_schema": TOOL_SCHEMA}],
        "thinking": {"type": "enabled", "budget_tokens": 16}, "stop_sequences": ["END"], "temperature": 0.5,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
        ]}),
    "openai_chat": ("/v1/chat/completions", {
        "model": "gpt-x", "max_tokens": 32, "temperature": 0.5, "stop": ["END"], "tool_choice": "auto",
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL_SCHEMA}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]}),
    "openai_responses": ("/v1/responses", {
        "model": "gpt-x", "max_output_tokens": 32, "instructions": "Be brief.", "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "get_weather", "parameters": TOOL_SCHEMA}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]}),
    "gemini": ("/v1beta/models/gemini-x:generateContent", {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "tools": [{"functionDeclarations": [{"name": "get_weather", "parameters": TOOL_SCHEMA}]}],
        "generationConfig": {"maxOutputTokens": 32, "temperature": 0.5, "stopSequences": ["END"]},
        "contents": [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"r": "sunny"}}}]},
        ]}),
}
# What each API's clients send besides the body: it also picks the error shape of an unroutable path.
API_HEADERS = {
    "anthropic": {"x-api-key": "sk-ant-fuzz", "anthropic-version": "2023-06-01"},
    "openai_chat": {"authorization": "Bearer sk-fuzz"},
    "openai_responses": {"authorization": "Bearer sk-fuzz"},
    "gemini": {"x-goog-api-key": "gm-fuzz"},
}
KINDS = {"valid": 4, "mutated": 30, "nested": 16, "method": 22, "binary": 10, "content_type": 10,
         "unknown_path": 4, "empty": 4}
OTHER_METHODS = ["GET", "HEAD", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"]
SIDE_PATHS = ["/", "/v1/models", "/v1beta/models", "/v1/nope", "/favicon.ico", "/v1/messages/x/y", "/s/fz/v1/models"]
WRONG_TYPES = ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
               "multipart/form-data; boundary=xyz", "application/xml", "application/octet-stream", "text/html"]
DEPTHS = [8, 64, 120, 127, 128, 129, 200, 1000, 5000]
STRINGS = ["", "x", "\x00", "\ud800", "🙂" * 3, "a" * 300, "{\"city\": 1}", "null", "<|im_end|>"]


@dataclass
class Probe:
    kind: str
    api: str  # whose error shape the answer must be in
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def probe(rng: random.Random, session: str = "fuzz") -> Probe:
    api = rng.choice(list(VALID))
    path, valid = VALID[api]
    kind = rng.choices(list(KINDS), list(KINDS.values()))[0]
    headers = {**API_HEADERS[api], "content-type": "application/json", "x-polar-session": session}
    method, body = "POST", json.dumps(valid).encode()
    if kind == "mutated":
        body = json.dumps(_mutate(rng, valid)).encode()
    elif kind == "nested":
        body = _nested(rng, valid)
    elif kind == "method":
        method = rng.choice(OTHER_METHODS)
        path = rng.choice([path, path, *SIDE_PATHS])
        body = body if method in ("PUT", "PATCH") else b""
    elif kind == "binary":
        body = rng.randbytes(rng.randrange(1, 300))
        headers["content-type"] = rng.choice(["application/json", "application/octet-stream"])
    elif kind == "content_type":
        headers["content-type"] = rng.choice(WRONG_TYPES)
    elif kind == "unknown_path":
        path = rng.choice(["/v1/nope", "/v1/messages/x/y", "/v1/chat/nope", "/v1beta/models/g:embedThings"])
    elif kind == "empty":
        body = b""
    return Probe(kind, api, method, path, headers, body)


def _mutate(rng: random.Random, value: Any) -> Any:
    """`value` with one position replaced by random JSON, or dropped."""
    where = rng.choice(paths(value))
    if where and rng.random() < 0.3:
        return drop(value, where)
    return replace(value, where, random_json(rng))


def _nested(rng: random.Random, valid: dict) -> bytes:
    """`valid` with one position (or the whole body) holding arrays or objects nested DEPTHS deep.
    Built as text: a deep document is what the gateway must refuse, not what this side can encode."""
    depth = rng.choice(DEPTHS)
    inner = "[" * depth + "1" + "]" * depth if rng.random() < 0.5 else '{"a":' * depth + "1" + "}" * depth
    where = rng.choice(paths(valid))
    return json.dumps(replace(valid, where, "\x00NEST\x00")).replace('"\\u0000NEST\\u0000"', inner).encode()


def random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random() if depth < 3 else rng.random() * 0.7
    if roll < 0.1:
        return None
    if roll < 0.2:
        return rng.random() < 0.5
    if roll < 0.35:
        return rng.choice([0, -1, 1, 2**31, -(2**53), 2**70, rng.randrange(-1000, 1000)])
    if roll < 0.45:
        return rng.choice([0.5, -1e308, 1e-300, rng.uniform(-10, 10)])
    if roll < 0.7:
        return rng.choice(STRINGS)
    if roll < 0.85:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(STRINGS + ["role", "type", "text", "content"]): random_json(rng, depth + 1)
            for _ in range(rng.randrange(4))}


# -- sending and judging ---------------------------------------------------------------------------


@dataclass
class Outcome:
    probe: Probe
    status: int | None  # None: no answer (see problems)
    call_id: str | None = None
    problems: list[str] = field(default_factory=list)


class KeepAlive:
    """One HTTP/1.1 connection, reused for every probe; a broken one is counted and reopened."""

    def __init__(self, url: str, timeout: float = 60):
        parts = urlsplit(url)
        self.host, self.port, self.timeout = parts.hostname, parts.port, timeout
        self.conn = self._open()

    def _open(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def send(self, p: Probe) -> Outcome:
        try:
            self.conn.request(p.method, p.path, body=p.body or None, headers=p.headers)
            resp = self.conn.getresponse()
            body = resp.read()
        except TimeoutError:
            return self._broken(p, "hang")
        except (http.client.HTTPException, OSError) as exc:
            return self._broken(p, f"dropped: {type(exc).__name__}")
        out = Outcome(p, resp.status, resp.getheader("x-polar-call-id"), judge(p, resp, body))
        if resp.will_close:
            out.problems.append("connection closed by polar")
            self.conn.close()
        return out

    def _broken(self, p: Probe, problem: str) -> Outcome:
        self.conn.close()
        self.conn = self._open()
        return Outcome(p, None, problems=[problem])

    def close(self) -> None:
        self.conn.close()


def judge(p: Probe, resp: http.client.HTTPResponse, body: bytes) -> list[str]:
    """What is wrong with polar's answer to `p` (empty: nothing)."""
    problems = []
    if resp.status >= 500:
        problems.append("5xx")
    if p.method == "HEAD" or resp.status == 204:
        if body:
            problems.append("body on HEAD/204")
    elif resp.status >= 400 and not any(error_shape(api, resp.status, body) for api in shapes(p)):
        problems.append(f"not in {p.api}'s error shape")
    if resp.status == 405 and not resp.getheader("allow"):
        problems.append("405 without Allow")
    if (p.method == "POST") != bool(resp.getheader("x-polar-call-id")):
        problems.append("POST not captured" if p.method == "POST" else "non-POST captured")
    return problems


def shapes(p: Probe) -> list[str]:
    """The error shapes acceptable for `p`: its API's on its own path; elsewhere polar guesses the caller."""
    return [p.api] if p.path == VALID[p.api][0] else list(VALID)


def error_shape(api: str, status: int, body: bytes) -> bool:
    """Whether `body` is an error object in `api`'s own shape."""
    try:
        obj = json.loads(body)
        if api == "anthropic":
            return obj["type"] == "error" and bool(obj["error"]["type"]) and bool(obj["error"]["message"])
        if api == "gemini":
            return obj["error"]["code"] == status and bool(obj["error"]["status"]) and bool(obj["error"]["message"])
        return bool(obj["error"]["message"]) and isinstance(obj["error"]["type"], str)
    except (ValueError, KeyError, TypeError):
        return False
