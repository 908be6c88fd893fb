"""Property-based fuzzing of the whole gateway over HTTP: thousands of generated and mutated requests
against the four provider APIs, and not one 5xx for a client's mistake.

The parser-level fuzz tests (tests/providers/) check each parser alone; this sends the requests
through the real proxy (detection, session, parsing, token-faithful rendering, the upstream call,
capture), so a crash anywhere on that path shows up as a 5xx or a dropped connection. Each request
that reaches a model route leaves a capture row, and every error answer is in the caller's own shape.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fuzz import drop, json_values, paths, replace

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

JSON = json_values(text=20, ints=st.integers(-2**40, 2**40))


@st.composite
def mutated(draw, api: str) -> bytes:
    """A valid request with one field replaced or dropped, a random JSON document, or random bytes."""
    _, body = VALID[api]
    kind = draw(st.sampled_from(["replace", "replace", "drop", "json", "bytes"]))
    if kind == "replace":
        return json.dumps(replace(body, draw(st.sampled_from(paths(body))), draw(JSON))).encode()
    if kind == "drop":
        return json.dumps(drop(body, draw(st.sampled_from(paths(body)[1:])))).encode()
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    return draw(st.binary(max_size=200))


def _error_shape(api: str, reply: httpx.Response) -> bool:
    body = reply.json()
    if api == "anthropic":
        return body["type"] == "error" and bool(body["error"]["type"]) and bool(body["error"]["message"])
    if api == "gemini":
        return body["error"]["code"] == reply.status_code and bool(body["error"]["status"]) and bool(body["error"]["message"])
    return bool(body["error"]["message"]) and "type" in body["error"]


@pytest.fixture(scope="module")
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("api", list(VALID))
def test_mutated_requests_get_client_errors_not_crashes(stack, client, api):
    session = f"fuzz-{api}-{uuid.uuid4().hex[:6]}"
    path, body = VALID[api]
    stack.script(rules=[{"match": "", "steps": [{"content": "ok"}]}])
    sent: list[int] = []

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(payload=mutated(api))
    def check(payload: bytes) -> None:
        reply = client.post(path, content=payload, headers={"content-type": "application/json",
                                                            "x-polar-session": session})
        sent.append(reply.status_code)
        assert reply.status_code < 500, (payload[:300], reply.status_code, reply.text[:300])
        if reply.status_code >= 400:
            assert _error_shape(api, reply), reply.text[:300]

    check()
    assert len(sent) >= 400 and any(s == 400 for s in sent)
    # The proxy still serves the valid request, and every call is on record.
    assert client.post(path, json=body, headers={"x-polar-session": session}).status_code == 200
    rows = stack.rows(session)
    assert len(rows) == len(sent) + 1
    assert {r["status"] for r in rows} <= {"ok", "error"}
    assert all(r["error_kind"] not in ("internal", "upstream_error") for r in rows)
