"""Real streaming through a running polar: official SDKs as clients, the scripted vLLM double sampling slowly.

The double is paced (a delay per token, and before the first one), so "streams for real" is measured,
not assumed: the first text must reach the SDK while most of the answer is still to be sampled, and the
message the SDK accumulates must equal the non-streamed answer to the same request. Around that: the
capture is committed before the terminal event, silences get keep-alives the SDKs accept, a client that
leaves aborts the upstream request and leaves a client_disconnected row with the partial tokens, and an
upstream that dies mid-stream gives the provider's error event and an error row.
"""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from polar.capture.reader import CaptureReader

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PROMPT = "Tell me about the weather."
LONG_TEXT = " ".join(f"word{i}" for i in range(150))  # ≈ 300 tokens: ~3 s at 10 ms per token
THINK_AND_CALL = {"reasoning": "The user wants the weather; I will look it up for Paris first.",
                  "content": "Let me check.", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                             {"name": "get_weather", "arguments": {"city": "東京"}}]}
APIS = ["anthropic", "openai_chat", "openai_responses", "gemini"]


def pace(stack, token_delay_s: float = 0.0, first_token_delay_s: float = 0.0) -> None:
    httpx.post(f"{stack.upstream_url}/_double/pace",
               json={"token_delay_s": token_delay_s, "first_token_delay_s": first_token_delay_s}).raise_for_status()


def stats(stack) -> dict:
    return httpx.get(f"{stack.upstream_url}/_double/stats").json()


def session_id(api: str) -> str:
    return f"live-{api}-{uuid.uuid4().hex[:8]}"


# -- each API through its official SDK: (first text time, end time, message), and the non-streamed message --


class Answer(tuple):
    """(reasoning, text, [(tool name, arguments object)]): a message as any API carries it."""


def anthropic_call(stack, session: str, stream: bool, thinking: bool):
    import anthropic

    client = anthropic.Anthropic(base_url=stack.url, api_key="sk-ant", default_headers={"x-polar-session": session},
                                 max_retries=0)
    kwargs = dict(model="claude-sonnet-4-5", max_tokens=4096, messages=[{"role": "user", "content": PROMPT}],
                  tools=[{"name": WEATHER["name"], "input_schema": WEATHER["parameters"]}])
    if thinking:
        kwargs["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    first = None
    if stream:
        with client.messages.stream(**kwargs) as s:
            for event in s:
                if first is None and event.type == "content_block_delta" and event.delta.type in ("text_delta", "thinking_delta"):
                    first = time.monotonic()
            message = s.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    answer = Answer(("".join(b.thinking for b in message.content if b.type == "thinking"),
                     "".join(b.text for b in message.content if b.type == "text"),
                     [(b.name, b.input) for b in message.content if b.type == "tool_use"]))
    return first, answer


def chat_call(stack, session: str, stream: bool, thinking: bool):
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk", default_headers={"x-polar-session": session},
                           max_retries=0)
    kwargs = dict(model="gpt-5", messages=[{"role": "user", "content": PROMPT}], tools=[{"type": "function", "function": WEATHER}])
    if thinking:
        kwargs["reasoning_effort"] = "medium"
    first = None
    if stream:
        with client.chat.completions.stream(**kwargs) as s:
            reasoning = ""
            for event in s:
                if event.type == "chunk" and event.chunk.choices:
                    delta = event.chunk.choices[0].delta
                    piece = (delta.model_extra or {}).get("reasoning") or ""
                    reasoning += piece
                    if first is None and (piece or delta.content):
                        first = time.monotonic()
            message = s.current_completion_snapshot.choices[0].message
    else:
        message = client.chat.completions.create(**kwargs).choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning") or ""
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    return first, Answer((reasoning, message.content or "", calls))


def responses_call(stack, session: str, stream: bool, thinking: bool):
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk", default_headers={"x-polar-session": session},
                           max_retries=0)
    kwargs = dict(model="gpt-5-codex", input=PROMPT, tools=[{"type": "function", "strict": False, **WEATHER}])
    if thinking:
        kwargs["reasoning"] = {"effort": "medium"}
    first = None
    if stream:
        with client.responses.stream(**kwargs) as s:
            for event in s:
                if first is None and event.type in ("response.output_text.delta", "response.reasoning_text.delta"):
                    first = time.monotonic()
            response = s.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    reasoning = "".join(c.text for i in response.output if i.type == "reasoning" for c in i.content or [])
    calls = [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"]
    return first, Answer((reasoning, response.output_text, calls))


def gemini_call(stack, session: str, stream: bool, thinking: bool):
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="gm", http_options=types.HttpOptions(base_url=stack.url,
                                                                      headers={"x-polar-session": session}))
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**WEATHER)])],
        thinking_config=types.ThinkingConfig(include_thoughts=True) if thinking else None)
    kwargs = dict(model="gemini-2.5-pro", contents=PROMPT, config=config)
    first, parts = None, []
    if stream:
        for chunk in client.models.generate_content_stream(**kwargs):
            new = [p for c in chunk.candidates or [] for p in c.content.parts or []]
            if first is None and any(p.text for p in new):
                first = time.monotonic()
            parts += new
    else:
        parts = client.models.generate_content(**kwargs).candidates[0].content.parts
    answer = Answer(("".join(p.text for p in parts if p.text and p.thought),
                     "".join(p.text for p in parts if p.text and not p.thought),
                     [(p.function_call.name, dict(p.function_call.args)) for p in parts if p.function_call]))
    return first, answer


def assert_same_message(stack, streamed: Answer, plain: Answer) -> None:
    """Token-faithful: polar parses the stream itself. Chat mode: polar relays vLLM's own streaming parse, minus the
    template glue vLLM keeps in some places and not others (upstream/results.py): the same message either way."""
    assert streamed == plain


CALLS = {"anthropic": anthropic_call, "openai_chat": chat_call, "openai_responses": responses_call, "gemini": gemini_call}


# -- the first text arrives early; the streamed message is the non-streamed one -----------------------


@pytest.mark.parametrize("api", APIS)
def test_first_text_arrives_while_most_of_the_answer_is_still_to_come(any_stack, api):
    stack = any_stack
    stack.script(steps=[{"content": LONG_TEXT}])
    _, plain = CALLS[api](stack, session_id(api), stream=False, thinking=False)  # (also warms the stack up)
    pace(stack, token_delay_s=0.01)
    session = session_id(api)
    started = time.monotonic()
    first, streamed = CALLS[api](stack, session, stream=True, thinking=False)
    ended = time.monotonic()
    assert first is not None, "no text event at all"
    share = (first - started) / (ended - started)
    assert share <= 0.3, f"the first text came after {share:.0%} of the answer's time"
    assert_same_message(stack, streamed, plain)
    assert streamed[1] == LONG_TEXT
    (row,) = stack.rows(session)
    assert row["status"] == "ok" and row["stream"] == 1 and row["t_first"] - row["t_start"] < 0.3 * (row["t_end"] - row["t_start"])
    assert len(row["completion_logprobs"]) == len(row["completion_ids"]) > 250


@pytest.mark.parametrize("api", APIS)
def test_reasoning_and_parallel_calls_stream_into_the_plain_answer(any_stack, api):
    stack = any_stack
    stack.script(steps=[THINK_AND_CALL])
    pace(stack, token_delay_s=0.002)
    session = session_id(api)
    _, streamed = CALLS[api](stack, session, stream=True, thinking=True)
    pace(stack)
    _, plain = CALLS[api](stack, session_id(api), stream=False, thinking=True)
    assert_same_message(stack, streamed, plain)
    assert streamed[2] == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "東京"})]
    assert streamed[0] == THINK_AND_CALL["reasoning"]
    (row,) = stack.rows(session)
    assert row["status"] == "ok" and "stream:" not in (row["rewrites"] or "")  # what was streamed is the final parse


# -- keep-alives while the upstream queues or prefills --------------------------------------------------

TERMINAL = {"anthropic": b"message_stop", "openai_chat": b"[DONE]", "openai_responses": b"response.completed",
            "gemini": b'"finishReason"'}
KEEPALIVE_MARKS = {
    "anthropic": b"event: ping",
    "openai_chat": b": keep-alive",
    "openai_responses": b"response.in_progress",
    "gemini": b"\n",  # blank lines: here before the first chunk
}


def raw_request(api: str, *, max_tokens: int = 4096) -> tuple[str, dict]:
    """A streaming request of `api` as raw JSON: its path and body."""
    if api == "anthropic":
        return "/v1/messages", {"model": "claude", "max_tokens": max_tokens, "stream": True,
                                "messages": [{"role": "user", "content": PROMPT}]}
    if api == "openai_chat":
        return "/v1/chat/completions", {"model": "gpt", "stream": True, "max_tokens": max_tokens,
                                        "messages": [{"role": "user", "content": PROMPT}]}
    if api == "openai_responses":
        return "/v1/responses", {"model": "gpt", "stream": True, "input": PROMPT, "max_output_tokens": max_tokens}
    return "/v1beta/models/gemini:streamGenerateContent?alt=sse", {
        "contents": [{"role": "user", "parts": [{"text": PROMPT}]}], "generationConfig": {"maxOutputTokens": max_tokens}}


@pytest.mark.parametrize("api", APIS)
def test_silence_before_the_first_token_gets_keepalives(any_stack, api):
    stack = any_stack
    stack.script(steps=[{"content": "Sunny, 21 degrees."}])
    pace(stack, first_token_delay_s=3.5)  # the stacks send a keep-alive after 1 s of silence
    session = session_id(api)
    path, body = raw_request(api)
    seen: list[tuple[float, bytes]] = []
    started = time.monotonic()
    with httpx.stream("POST", stack.url + path, json=body, headers={"x-polar-session": session}, timeout=30) as r:
        assert r.status_code == 200
        for data in r.iter_raw():
            seen.append((time.monotonic() - started, data))
    body_bytes = b"".join(d for _, d in seen)
    before_first = body_bytes.split(b"data:", 1)[0]  # (Anthropic's first ping may follow message_start)
    assert KEEPALIVE_MARKS[api] in (before_first if api == "gemini" else body_bytes)
    assert seen[0][0] < 2.5, "nothing reached the client before the first token"
    assert TERMINAL[api] in body_bytes  # and then the answer, to its end
    # and the SDK reads such a stream to the same answer
    pace(stack, first_token_delay_s=2.5)
    _, answer = CALLS[api](stack, session_id(api), stream=True, thinking=False)
    assert answer[1] == "Sunny, 21 degrees."


# -- the capture is there before the terminal event --------------------------------------------------



@pytest.mark.parametrize("api", APIS)
def test_the_row_is_committed_before_the_terminal_event(any_stack, api):
    stack = any_stack
    stack.script(steps=[{"content": "Cloudy."}])
    session = session_id(api)
    path, body = raw_request(api)
    received = b""
    with httpx.stream("POST", stack.url + path, json=body, headers={"x-polar-session": session}, timeout=30) as r:
        for data in r.iter_raw():
            received += data
            if TERMINAL[api] in received:
                rows = list(CaptureReader(stack.db).calls(session=session))  # read-only, from the file
                assert [row["status"] for row in rows] == ["ok"]
                assert rows[0]["completion_ids"] and len(rows[0]["completion_logprobs"]) == len(rows[0]["completion_ids"])
                break
        else:
            pytest.fail(f"no terminal event in {received[-300:]!r}")


# -- the client leaves: the upstream request is aborted, the partial turn kept ----------------------------


@pytest.mark.parametrize("api", APIS)
def test_a_client_that_leaves_aborts_the_upstream_and_keeps_the_partial_turn(any_stack, api):
    stack = any_stack
    stack.script(steps=[{"content": LONG_TEXT}])
    pace(stack, token_delay_s=0.02)  # ≈ 6 s for the whole answer
    before = stats(stack)
    session = session_id(api)
    path, body = raw_request(api)
    with httpx.stream("POST", stack.url + path, json=body, headers={"x-polar-session": session}, timeout=30) as r:
        received = b""
        for data in r.iter_raw():
            received += data
            if received.count(b"word") >= 5:
                break  # leave mid-answer
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = stack.rows(session)
        if rows and rows[0]["status"] != "pending" and stats(stack)["streams_aborted"] > before["streams_aborted"]:
            break
        time.sleep(0.1)
    after = stats(stack)
    assert after["streams_aborted"] == before["streams_aborted"] + 1, (before, after)
    (row,) = stack.rows(session)
    assert row["status"] == "client_disconnected" and row["error_kind"] == "client_disconnected"
    assert 5 <= row["completion_len"] < 250, row["completion_len"]
    assert len(row["completion_logprobs"]) == row["completion_len"]
    assert row["finish_reason"] == "abort"
    if stack.mode == "token-faithful":
        assert stack.proxy.addon.gate.in_flight == 0  # the sampling slot is free again


# -- the upstream dies mid-stream: the provider's error event, an error row -------------------------------

SDK_ERRORS = {"anthropic": "APIStatusError", "openai_chat": "APIError", "openai_responses": "response.failed",
              "gemini": "APIError"}


@pytest.mark.parametrize("api", APIS)
def test_an_upstream_that_dies_mid_stream_ends_in_the_providers_error(any_stack, api):
    stack = any_stack
    stack.script(steps=[{"content": LONG_TEXT}])
    pace(stack, token_delay_s=0.01)  # the 5 tokens are sent before the connection breaks
    stack.fault(mode="die_mid_stream", after_tokens=5, count=1)
    session = session_id(api)
    if api == "openai_responses":
        import openai

        client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk", default_headers={"x-polar-session": session},
                               max_retries=0)
        events = list(client.responses.create(model="gpt", input=PROMPT, stream=True))
        assert events[-1].type == "response.failed" and "broke off" in events[-1].response.error.message
    else:
        with pytest.raises(Exception) as raised:
            CALLS[api](stack, session, stream=True, thinking=False)
        assert type(raised.value).__name__ in (SDK_ERRORS[api], "APIStatusError", "InternalServerError", "ServerError")
    (row,) = stack.rows(session)
    assert row["status"] == "error" and row["error_kind"] == "upstream_error" and row["finish_reason"] == "abort"
    assert row["completion_len"] == 5 and len(row["completion_logprobs"]) == 5


# -- refused before the first token: a plain error answer, the provider's own status -------------------

REFUSED_STATUS = {"anthropic": 529, "openai_chat": 503, "openai_responses": 503, "gemini": 503}


@pytest.mark.parametrize("api", APIS)
def test_a_refusal_before_the_first_token_is_a_plain_error_answer(any_stack, api):
    stack = any_stack
    stack.fault(mode="status", status=503, count=1)  # vLLM refuses (overloaded) before it streams anything
    session = session_id(api)
    path, body = raw_request(api)
    r = httpx.post(stack.url + path, json=body, headers={"x-polar-session": session}, timeout=30)
    assert r.status_code == REFUSED_STATUS[api] and r.headers["content-type"].startswith("application/json")
    assert "error" in r.json()
    (row,) = stack.rows(session)
    assert (row["status"], row["error_kind"], row["stream"]) == ("error", "upstream_unavailable", 1)
