"""One session can neither write into nor read from another session's captures.

A runtime binds each sandbox to its session (a per-session API key, or the container's address).
A harness that names another session — by the `x-polar-session` header or a `/s/<id>/` base URL —
is refused in its own provider's error shape, and the refusal is recorded in its *own* session.
Reading: a bound client's conversation that repeats another session's history word for word does
not inherit that session's tokens (prompt parents stay in the session), and a `previous_response_id`
of another session is not found. The registry's rules alone: tests/sessions/test_identity.py.
"""

from __future__ import annotations

import secrets
import uuid

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from polar.sessions.identity import SESSION_HEADER

ANSWER = "isolated answer"


@pytest.fixture
def bound(stack):
    """Two sessions, each bound to its own API key as a runtime does; the keys die with the test."""
    registry = stack.proxy.addon.gateway.registry
    keys = {name: f"sk-polar-{secrets.token_hex(8)}" for name in ("a", "b")}
    sessions = {name: f"iso-{name}-{uuid.uuid4().hex[:6]}" for name in keys}
    for name, key in keys.items():
        registry.register_key(key, sessions[name])
    yield keys, sessions
    for key in keys.values():
        registry.forget_key(key)


def _anthropic(url: str, key: str, headers: dict) -> str:
    client = anthropic.Anthropic(base_url=url, api_key=key, default_headers=headers, max_retries=0)
    message = client.messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    return message.content[0].text


def _chat(url: str, key: str, headers: dict) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, default_headers=headers, max_retries=0)
    return client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content


def _responses(url: str, key: str, headers: dict) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, default_headers=headers, max_retries=0)
    return client.responses.create(model="gpt-x", input="hi").output_text


def _gemini(url: str, key: str, headers: dict) -> str:
    client = genai.Client(api_key=key, http_options=genai_types.HttpOptions(base_url=url, headers=headers))
    return client.models.generate_content(model="gemini-x", contents="hi").text


CLIENTS = {"anthropic": _anthropic, "chat": _chat, "responses": _responses, "gemini": _gemini}
REFUSED = {  # what each official SDK raises for polar's 403, and the status it carries
    "anthropic": anthropic.PermissionDeniedError,
    "chat": openai.PermissionDeniedError,
    "responses": openai.PermissionDeniedError,
    "gemini": genai_errors.ClientError,
}


@pytest.mark.parametrize("claim", ["header", "path"])
@pytest.mark.parametrize("api", list(CLIENTS))
def test_a_bound_client_cannot_write_into_another_session(stack, bound, api, claim):
    keys, sessions = bound
    stack.script(steps=[{"content": ANSWER}])
    url = stack.url if claim == "header" else f"{stack.url}/s/{sessions['b']}"
    headers = {SESSION_HEADER: sessions["b"]} if claim == "header" else {}

    with pytest.raises(REFUSED[api]) as refused:
        CLIENTS[api](url, keys["a"], headers)
    status = getattr(refused.value, "status_code", None) or getattr(refused.value, "code", None)
    assert status == 403
    assert sessions["a"] in str(refused.value) and sessions["b"] in str(refused.value)

    assert stack.rows(sessions["b"]) == []  # nothing landed in the other session
    (row,) = stack.rows(sessions["a"])  # the refusal is on record in the caller's own session
    assert (row["status"], row["http_status"], row["error_kind"]) == ("error", 403, "permission")

    # The same client naming its own session, or none, is served as usual.
    own = {SESSION_HEADER: sessions["a"]} if claim == "header" else {}
    own_url = stack.url if claim == "header" else f"{stack.url}/s/{sessions['a']}"
    stack.script(steps=[{"content": ANSWER}])
    assert CLIENTS[api](own_url, keys["a"], own) == ANSWER
    assert [r["status"] for r in stack.rows(sessions["a"])] == ["error", "ok"]


def test_unbound_clients_may_name_their_session(stack):
    """Reverse/base-URL mode without a runtime: the header or path is how a session is named at all."""
    session = f"iso-free-{uuid.uuid4().hex[:6]}"
    stack.script(steps=[{"content": ANSWER}])
    assert _chat(f"{stack.url}/s/{session}", "any-key", {}) == ANSWER
    assert [r["status"] for r in stack.rows(session)] == ["ok"]


@pytest.mark.parametrize(("lines", "named"), [
    ([(b"x-polar-session", b"caf\xe9 \xc3\xa9")], "caf____"),  # bytes outside the id alphabet, one "_" each
    ([(b"x-polar-session", b"first"), (b"x-polar-session", b"second")], "second"),  # repeated: the last line
    ([(b"x-api-key", b"sk-\x80\xff")], None),  # a key that is not UTF-8 still names one session
    ([(b"authorization", b"Bearer \xc3")], None),
])
def test_any_bytes_in_naming_headers_are_served_and_captured(stack, lines, named):
    """The names the `--workers` front hashes by (tests/mitm/test_front.py), end to end: answered, captured,
    the same session on a second call."""
    stack.script(steps=[{"content": ANSWER}, {"content": ANSWER}])
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}
    sessions = set()
    for _ in range(2):
        resp = httpx.post(f"{stack.url}/v1/chat/completions", json=body, headers=lines, timeout=60)
        assert resp.status_code == 200, resp.text
        sessions.add(resp.headers[SESSION_HEADER])
    (session,) = sessions
    assert session == named if named else session.startswith("key-")
    rows = stack.rows(session)
    assert [r["status"] for r in rows][-2:] == ["ok", "ok"]


def test_a_session_does_not_inherit_another_sessions_tokens(stack, bound):
    """B replays A's whole conversation: polar builds B's prompt on its own, never on A's rows."""
    keys, sessions = bound
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    stack.script(steps=[
        {"content": "", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
        {"content": "Cold in Oslo."},
    ])
    a = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=keys["a"], max_retries=0)
    history = [{"role": "user", "content": "Weather in Oslo?"}]
    first = a.chat.completions.create(model="gpt-x", messages=history, tools=[tool]).choices[0].message
    history += [first.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "-3 °C"}]
    assert a.chat.completions.create(model="gpt-x", messages=history, tools=[tool]).choices[0].message.content == "Cold in Oslo."

    stack.script(steps=[{"content": "Cold in Oslo."}])
    b = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=keys["b"], max_retries=0)
    assert b.chat.completions.create(model="gpt-x", messages=history, tools=[tool]).choices[0].message.content == "Cold in Oslo."

    rows_a, (row_b,) = stack.rows(sessions["a"]), stack.rows(sessions["b"])
    assert rows_a[1]["prompt_mode"] == "token-faithful"  # A's second call reused A's own sampled ids
    assert rows_a[1]["prompt_parent"] == rows_a[0]["id"]
    # B's identical conversation is new to B: rendered from its messages, no reference into A's rows.
    assert row_b["prompt_mode"] == "re-render: first call of the session"
    assert row_b["prompt_parent"] is None


def test_another_sessions_previous_response_is_not_found(stack, bound):
    keys, sessions = bound
    stack.script(steps=[{"content": ANSWER}, {"content": ANSWER}])
    first = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=keys["a"], max_retries=0).responses.create(
        model="gpt-x", input="remember this")
    b = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=keys["b"], max_retries=0)
    with pytest.raises(openai.BadRequestError, match="not found"):
        b.responses.create(model="gpt-x", previous_response_id=first.id, input="what did A say?")
    assert [r["status"] for r in stack.rows(sessions["b"])] == ["error"]


def test_polar_serves_no_capture_data_over_http(stack, bound):
    """The proxy has no read API a harness could use: unknown GETs are a provider 404, nothing captured."""
    keys, sessions = bound
    for path in ("/captures", "/v1/calls", "/_polar/rows", f"/s/{sessions['b']}/v1/responses/anything"):
        reply = httpx.get(f"{stack.url}{path}", headers={"authorization": f"Bearer {keys['a']}"})
        assert reply.status_code in (403, 404), (path, reply.status_code)
        assert sessions["b"] not in reply.text or "may not act as" in reply.text
