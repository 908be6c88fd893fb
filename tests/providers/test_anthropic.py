"""The Anthropic Messages provider against the official `anthropic` SDK (no network).

The SDK talks to an in-process handler through a mock HTTP transport; the handler plays the
gateway's part (route, parse, answer from a script, render), so every response shape here is
checked by the SDK's own parsers and stream accumulator.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import anthropic
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.canonical import (
    ChatRequest,
    ChatResult,
    ImagePart,
    Message,
    Reasoning,
    TextPart,
    ToolCall,
    Usage,
)
from polar.errors import ErrorKind, GatewayError
from polar.providers.anthropic import AnthropicContext, AnthropicMessages
from polar.providers.base import HttpReply, Parsed, Route
from polar.providers.stream import pieces
from tests.providers.support import PROVIDERS, SEALER
from tests.support.fuzz import json_values, paths, replace

PROVIDER: AnthropicMessages = PROVIDERS.by_name["anthropic"]
seal, sign, unseal, verify = SEALER.seal, SEALER.sign, SEALER.unseal, SEALER.verify


def parse(body: Any) -> ChatRequest:
    return PROVIDER.parse(Route(PROVIDER, "generate"), body).request
MODEL = "claude-sonnet-test"
FIXTURE = Path(__file__).resolve().parents[2].parent / "shared/reference/wire/anthropic_stream_thinking_fixture.sse"

Answer = Callable[[ChatRequest], "ChatResult | GatewayError"]


class AnthropicGateway:
    """Stands in for the gateway around the provider: routes, parses, answers from a script."""

    def __init__(self, answer: Answer, input_tokens: int = 42):
        self.answer = answer
        self.input_tokens = input_tokens
        self.routes: list[Route] = []
        self.requests: list[ChatRequest] = []
        self.parsed: list[Parsed[AnthropicContext]] = []
        self.bodies: list[dict] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        reply = self._reply(request.method, request.url.path, dict(request.url.params), request.content)
        return httpx2.Response(reply.status, headers=reply.headers, content=reply.body)

    def _reply(self, method: str, path: str, query: dict[str, str], content: bytes) -> HttpReply:
        if method == "GET" and path.endswith("/v1/models"):
            return PROVIDER.render_models(["qwen-a", "qwen-b"])
        route = PROVIDER.match(method, path, query, {})
        if route is None:
            return PROVIDER.render_error(GatewayError("not_found", f"no endpoint {path}"))
        self.routes.append(route)
        try:
            body = json.loads(content)
            self.bodies.append(body)
            parsed = PROVIDER.parse(route, body)
            request = parsed.request
            self.parsed.append(parsed)
            self.requests.append(request)
            if route.endpoint == "count_tokens":
                return PROVIDER.render_count(route, self.input_tokens)
            outcome = self.answer(request)
            if isinstance(outcome, GatewayError):
                raise outcome
            return PROVIDER.render(route, parsed.context, request, outcome)
        except GatewayError as error:
            return PROVIDER.render_error(error)

    def client(self) -> anthropic.Anthropic:
        http_client = httpx2.Client(transport=httpx2.MockTransport(self.handle))
        return anthropic.Anthropic(api_key="k", base_url="http://polar.test", max_retries=0, http_client=http_client)

    def async_client(self) -> anthropic.AsyncAnthropic:
        http_client = httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))
        return anthropic.AsyncAnthropic(
            api_key="k", base_url="http://polar.test", max_retries=0, http_client=http_client
        )


def result(
    content: str = "",
    *,
    reasoning: str | None = None,
    calls: list[ToolCall] | None = None,
    finish: str = "stop",
    stop_sequence: str | None = None,
    cached: int = 0,
) -> ChatResult:
    return ChatResult(
        id="0123abcd",
        model="qwen-internal",
        created=1_700_000_000,
        content=content,
        reasoning=Reasoning(text=reasoning) if reasoning is not None else None,
        tool_calls=calls or [],
        finish_reason=finish,
        stop_sequence=stop_sequence,
        usage=Usage(prompt_tokens=25, completion_tokens=40, cached_tokens=cached),
    )


def answering(outcome: ChatResult | GatewayError) -> AnthropicGateway:
    return AnthropicGateway(lambda _request: outcome)


def blocks(message: anthropic.types.Message) -> list[dict]:
    return [block.model_dump(exclude_none=True) for block in message.content]


EPHEMERAL = {"type": "ephemeral"}
URL_SOURCE = {"type": "url", "url": "https://example.invalid/a.png"}
USER_HI = [{"role": "user", "content": "Hi"}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
LONG_TEXT = "The quick brown fox jumps over the lazy dog. " * 5  # > 64 chars: several text deltas
THOUGHT = "The user wants the weather in Paris and Tokyo; I should call the tool for Paris first. " * 2
PARIS = ToolCall(id="call_paris", name="get_weather", arguments='{"city": "Paris", "note": "naïve \\"quoted\\" text"}')
TOKYO = ToolCall(id="call_tokyo", name="get_weather", arguments='{"city":"Tokyo"}')

# Each scripted answer with the content blocks a client must end up with.
SCENARIOS: dict[str, tuple[ChatResult, list[dict], str]] = {
    "text": (result(LONG_TEXT), [{"type": "text", "text": LONG_TEXT}], "end_turn"),
    "tool_call": (
        result(calls=[PARIS], finish="tool_calls"),
        [{"type": "tool_use", "id": "call_paris", "name": "get_weather", "input": PARIS.arguments_obj()}],
        "tool_use",
    ),
    "parallel_tool_calls": (
        result("Checking both.", calls=[PARIS, TOKYO], finish="tool_calls"),
        [
            {"type": "text", "text": "Checking both."},
            {"type": "tool_use", "id": "call_paris", "name": "get_weather", "input": PARIS.arguments_obj()},
            {"type": "tool_use", "id": "call_tokyo", "name": "get_weather", "input": {"city": "Tokyo"}},
        ],
        "tool_use",
    ),
    "thinking_text_tool": (
        result("Let me look.", reasoning=THOUGHT, calls=[PARIS], finish="tool_calls"),
        [
            {"type": "thinking", "thinking": THOUGHT, "signature": sign(THOUGHT)},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "call_paris", "name": "get_weather", "input": PARIS.arguments_obj()},
        ],
        "tool_use",
    ),
}


def create_kwargs(**extra: Any) -> dict:
    return {"model": MODEL, "max_tokens": 1024, "messages": USER_HI, "tools": [WEATHER_TOOL], **extra}


# ---------------------------------------------------------------------------------------------
# routing


@pytest.mark.parametrize(
    ("method", "path", "endpoint"),
    [
        ("POST", "/v1/messages", "generate"),
        ("POST", "/v1/messages/", "generate"),
        ("POST", "/s/abc123/v1/messages", "generate"),
        ("POST", "/v1/messages/count_tokens", "count_tokens"),
        ("POST", "/v1/messages/count_tokens/", "count_tokens"),
        ("post", "/v1/messages?beta=true", "generate"),
        ("GET", "/v1/messages", None),
        ("POST", "/v1/messages/batches", None),
        ("POST", "/v1/chat/completions", None),
        ("POST", "/v1/responses", None),
    ],
)
def test_match(method: str, path: str, endpoint: str | None) -> None:
    route = PROVIDER.match(method, path, {"beta": "true"}, {})
    assert (route.endpoint if route else None) == endpoint
    if route:
        assert route.provider is PROVIDER and route.query == {"beta": "true"}


def test_beta_client_and_beta_query_are_routed() -> None:
    gateway = answering(result("ok"))
    client = gateway.client()
    assert client.beta.messages.create(model=MODEL, max_tokens=10, messages=USER_HI).content[0].text == "ok"
    # Claude Code's client appends ?beta=true to the same path.
    client.messages.create(model=MODEL, max_tokens=10, messages=USER_HI, extra_query={"beta": "true"})
    assert [(r.endpoint, r.query) for r in gateway.routes] == [("generate", {}), ("generate", {"beta": "true"})]


# ---------------------------------------------------------------------------------------------
# answers: non-streamed, streamed through the helper, raw events, async


@pytest.mark.parametrize("name", SCENARIOS)
def test_non_streamed(name: str) -> None:
    scripted, expected, stop_reason = SCENARIOS[name]
    message = answering(scripted).client().messages.create(**create_kwargs())
    assert isinstance(message, anthropic.types.Message)
    assert blocks(message) == expected
    assert message.id == "msg_0123abcd" and message.model == MODEL and message.role == "assistant"
    assert message.stop_reason == stop_reason and message.stop_sequence is None
    assert message.usage.input_tokens == 25 and message.usage.output_tokens == 40
    assert message.usage.cache_read_input_tokens == 0 and message.usage.cache_creation_input_tokens == 0


@pytest.mark.parametrize("name", SCENARIOS)
def test_streamed_final_message(name: str) -> None:
    scripted, expected, stop_reason = SCENARIOS[name]
    with answering(scripted).client().messages.stream(**create_kwargs()) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert blocks(message) == expected
    assert text == scripted.content
    assert message.id == "msg_0123abcd" and message.model == MODEL
    assert message.stop_reason == stop_reason
    assert (message.usage.input_tokens, message.usage.output_tokens) == (25, 40)


@pytest.mark.parametrize("name", SCENARIOS)
def test_streamed_raw_events(name: str) -> None:
    scripted, expected, stop_reason = SCENARIOS[name]
    events = list(answering(scripted).client().messages.create(**create_kwargs(), stream=True))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    start = events[0].message
    assert start.stop_reason is None and start.content == [] and start.usage.input_tokens == 25
    assert events[-2].type == "message_delta"
    assert events[-2].delta.stop_reason == stop_reason and events[-2].usage.output_tokens == 40

    for index, block in enumerate(expected):
        opened = [e for e in events if e.type == "content_block_start" and e.index == index]
        deltas = [e.delta for e in events if e.type == "content_block_delta" and e.index == index]
        closed = [e for e in events if e.type == "content_block_stop" and e.index == index]
        assert len(opened) == 1 and len(closed) == 1
        assert events.index(opened[0]) < events.index(closed[0])
        if block["type"] == "text":
            assert opened[0].content_block.text == ""
            assert "".join(d.text for d in deltas) == block["text"]
            assert [d.text for d in deltas] == pieces(block["text"], 16)  # one delta per streamed piece
        elif block["type"] == "tool_use":
            assert opened[0].content_block.input == {} and opened[0].content_block.id == block["id"]
            assert deltas[0].partial_json == "" and all(d.type == "input_json_delta" for d in deltas)
            assert json.loads("".join(d.partial_json for d in deltas)) == block["input"]
        else:
            assert [d.type for d in deltas[:-1]] == ["thinking_delta"] * (len(deltas) - 1)
            assert "".join(d.thinking for d in deltas[:-1]) == block["thinking"]
            assert deltas[-1].type == "signature_delta" and deltas[-1].signature == block["signature"]


def test_async_stream() -> None:
    scripted, expected, _ = SCENARIOS["thinking_text_tool"]

    async def run() -> anthropic.types.Message:
        async with answering(scripted).async_client().messages.stream(**create_kwargs()) as stream:
            async for _event in stream:
                pass
            return await stream.get_final_message()

    assert blocks(asyncio.run(run())) == expected


def _event_shape(sse: str) -> list[str]:
    """Event names (with delta type) in order, consecutive repeats collapsed."""
    shape: list[str] = []
    for chunk in sse.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        data = json.loads(lines["data"])
        name = lines["event"] + (f":{data['delta']['type']}" if data["type"] == "content_block_delta" else "")
        if not shape or shape[-1] != name:
            shape.append(name)
    return shape


@pytest.mark.skipif(not FIXTURE.exists(), reason="shared reference fixtures are not present")
def test_stream_event_order_matches_fixture() -> None:
    parsed = PROVIDER.parse(Route(PROVIDER, "generate"), create_kwargs(stream=True))
    reply = PROVIDER.render(
        Route(PROVIDER, "generate"), parsed.context, parsed.request, result(LONG_TEXT, reasoning=THOUGHT)
    )
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert _event_shape(reply.body.decode()) == _event_shape(FIXTURE.read_text())


def test_stream_has_no_done_marker_and_thinking_ends_with_signature() -> None:
    parsed = PROVIDER.parse(Route(PROVIDER, "generate"), create_kwargs(stream=True))
    body = PROVIDER.render(Route(PROVIDER, "generate"), parsed.context, parsed.request, result("hi", reasoning="hmm"))
    body = body.body.decode()
    assert "[DONE]" not in body
    assert _event_shape(body)[3:6] == [
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",
        "content_block_stop",
    ]


@pytest.mark.parametrize(
    ("finish", "stop_reason", "stop_sequence"),
    [
        ("stop", "end_turn", None),
        ("length", "max_tokens", None),
        ("stop_sequence", "stop_sequence", "END"),
        ("content_filter", "refusal", None),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_stop_reasons(finish: str, stop_reason: str, stop_sequence: str | None, stream: bool) -> None:
    scripted = result("partial", finish=finish, stop_sequence=stop_sequence)
    client = answering(scripted).client()
    if stream:
        with client.messages.stream(**create_kwargs(stop_sequences=["END"])) as s:
            message = s.get_final_message()
    else:
        message = client.messages.create(**create_kwargs(stop_sequences=["END"]))
    assert (message.stop_reason, message.stop_sequence) == (stop_reason, stop_sequence)


@pytest.mark.parametrize("stream", [False, True])
def test_cached_tokens_are_reported_as_cache_reads(stream: bool) -> None:
    client = answering(result("x", cached=20)).client()
    if stream:
        with client.messages.stream(**create_kwargs()) as s:
            usage = s.get_final_message().usage
    else:
        usage = client.messages.create(**create_kwargs()).usage
    # Anthropic counts cache reads beside input_tokens, not inside it.
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (5, 20, 0)


def test_tool_arguments_that_are_not_an_object_are_passed_raw() -> None:
    broken = ToolCall(id="call_x", name="get_weather", arguments='{"city": "Par')
    listed = ToolCall(id="call_y", name="get_weather", arguments="[1, 2]")
    client = answering(result(calls=[broken, listed], finish="tool_calls")).client()
    with client.messages.stream(**create_kwargs()) as stream:
        streamed = stream.get_final_message()
    plain = client.messages.create(**create_kwargs())
    for message in (streamed, plain):
        assert [b.input for b in message.content] == [{"_raw": '{"city": "Par'}, {"_raw": "[1, 2]"}]


def test_empty_answer_keeps_one_text_block() -> None:
    message = answering(result("")).client().messages.create(**create_kwargs())
    assert blocks(message) == [{"type": "text", "text": ""}]


# ---------------------------------------------------------------------------------------------
# count_tokens and models


def test_count_tokens() -> None:
    gateway = answering(result("unused"))
    count = gateway.client().messages.count_tokens(
        model=MODEL,
        system="You are terse.",
        messages=USER_HI,
        tools=[WEATHER_TOOL],
        thinking={"type": "enabled", "budget_tokens": 2048},
    )
    assert count.input_tokens == 42
    assert gateway.routes[0].endpoint == "count_tokens"
    request = gateway.requests[0]
    assert request.sampling.max_tokens is None and request.stream is False
    assert [m.role for m in request.messages] == ["system", "user"]
    assert request.tools[0].name == "get_weather" and request.thinking.budget_tokens == 2048


def test_beta_count_tokens() -> None:
    gateway = answering(result("unused"))
    client = gateway.client()
    assert client.beta.messages.count_tokens(model=MODEL, messages=USER_HI).input_tokens == 42
    client.messages.count_tokens(model=MODEL, messages=USER_HI, extra_query={"beta": "true"})
    assert [(r.endpoint, r.query) for r in gateway.routes] == [("count_tokens", {}), ("count_tokens", {"beta": "true"})]


def test_models_listing() -> None:
    page = answering(result("unused")).client().models.list()
    assert [m.id for m in page.data] == ["qwen-a", "qwen-b"]
    assert page.data[0].type == "model" and page.data[0].display_name == "qwen-a"
    assert page.data[0].created_at.year >= 2024
    assert (page.first_id, page.last_id, page.has_more) == ("qwen-a", "qwen-b", False)


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    ("error", "exception", "status", "error_type"),
    [
        (GatewayError("invalid_request", "bad"), anthropic.BadRequestError, 400, "invalid_request_error"),
        (GatewayError("authentication", "no key"), anthropic.AuthenticationError, 401, "authentication_error"),
        (GatewayError("not_found", "no model"), anthropic.NotFoundError, 404, "not_found_error"),
        (GatewayError("too_large", "big"), anthropic.ContentTooLargeError, 413, "request_too_large"),
        (GatewayError("rate_limit", "slow down"), anthropic.RateLimitError, 429, "rate_limit_error"),
        (GatewayError("upstream_unavailable", "down"), anthropic.OverloadedError, 529, "overloaded_error"),
        # A status chosen by whoever raised the error is kept.
        (GatewayError("upstream_error", "busy", status=503), anthropic.ServiceUnavailableError, 503, "api_error"),
        (GatewayError("upstream_timeout", "slow"), anthropic.GatewayTimeoutError, 504, "timeout_error"),
        (GatewayError("upstream_error", "garbage"), anthropic.InternalServerError, 502, "api_error"),
        (GatewayError("internal", "bug"), anthropic.InternalServerError, 500, "api_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_errors_raise_the_sdk_exception(
    error: GatewayError, exception: type, status: int, error_type: str, stream: bool
) -> None:
    client = answering(error).client()
    with pytest.raises(exception) as caught:
        if stream:
            with client.messages.stream(**create_kwargs()) as s:
                s.get_final_message()
        else:
            client.messages.create(**create_kwargs())
    assert isinstance(caught.value, anthropic.APIStatusError)
    assert caught.value.status_code == status
    body = caught.value.body
    assert body["type"] == "error" and body["error"] == {"type": error_type, "message": error.message}
    assert body["request_id"].startswith("req_") and caught.value.request_id == body["request_id"]


@pytest.mark.parametrize("kind", get_args(ErrorKind))
def test_every_error_kind_has_an_anthropic_error(kind: str) -> None:
    reply = PROVIDER.render_error(GatewayError(kind, "what happened"))
    body = json.loads(reply.body)
    assert reply.status >= 400 and reply.headers["request-id"] == body["request_id"]
    assert set(body) == {"type", "error", "request_id"} and body["error"]["type"].endswith(("_error", "_large"))


def test_context_length_error_reads_prompt_is_too_long() -> None:
    client = answering(GatewayError("context_length", "40000 tokens > 32768 maximum")).client()
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**create_kwargs())
    assert caught.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "prompt is too long: 40000 tokens > 32768 maximum",
    }
    already = PROVIDER.render_error(GatewayError("context_length", "prompt is too long: 5 > 4"))
    assert json.loads(already.body)["error"]["message"] == "prompt is too long: 5 > 4"


def test_bad_request_through_the_sdk_names_the_field() -> None:
    client = answering(result("unused")).client()
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "robot", "content": "x"}])
    assert "messages[0].role" in caught.value.body["error"]["message"]


GOOD = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _with(**changes: Any) -> dict:
    return {k: v for k, v in {**GOOD, **changes}.items() if v is not ...}


def _user(*content: Any) -> dict:
    return _with(messages=[{"role": "user", "content": list(content)}])


def _assistant(*content: Any) -> dict:
    return _with(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": list(content)}])


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ([GOOD], "request body"),
        (_with(model=...), "'model'"),
        (_with(model=7), "'model'"),
        (_with(max_tokens=...), "'max_tokens'"),
        (_with(max_tokens="16"), "'max_tokens'"),
        (_with(max_tokens=True), "'max_tokens'"),
        (_with(max_tokens=0), "'max_tokens'"),
        (_with(messages={"role": "user"}), "'messages'"),
        (_with(messages=[]), "'messages'"),
        (_with(messages=["hi"]), "messages[0]"),
        (_with(messages=[{"role": "user"}]), "messages[0].content"),
        (_with(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (_with(messages=[{"role": 1, "content": "x"}]), "messages[0].role"),
        (_user("text"), "messages[0].content[0]"),
        (_user({"text": "no type"}), "messages[0].content[0].type"),
        (_user({"type": "text", "text": 3}), "messages[0].content[0].text"),
        (_user({"type": "image", "source": {"type": "file", "file_id": "f"}}), "messages[0].content[0].source.type"),
        (_user({"type": "image", "source": {"type": "base64", "media_type": "image/png"}}), "source.data"),
        (_user({"type": "image"}), "messages[0].content[0].source"),
        (_user({"type": "tool_result", "content": "x"}), "messages[0].content[0].tool_use_id"),
        (_user({"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}), "content[0].is_error"),
        (_user({"type": "tool_result", "tool_use_id": "t", "content": 9}), "messages[0].content[0].content"),
        (_user({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "thinking"}]}), "content[0].content"),
        (_user({"type": "thinking", "thinking": "x"}), "messages[0].content[0]"),
        (_user({"type": "video"}), "'video'"),
        (_assistant({"type": "tool_use", "id": "t", "name": "f", "input": [1]}), "messages[1].content[0].input"),
        (_assistant({"type": "tool_use", "name": "f"}), "messages[1].content[0].id"),
        (_assistant({"type": "thinking", "signature": "s"}), "messages[1].content[0].thinking"),
        (_assistant({"type": "redacted_thinking"}), "messages[1].content[0].data"),
        (_assistant({"type": "image", "source": {}}), "'image'"),
        (_with(system=5), "'system'"),
        (_with(system=[{"type": "image", "source": {}}]), "system[0]"),
        (_with(system=[{"type": "text"}]), "system[0].text"),
        (_with(tools={"name": "f"}), "'tools'"),
        (_with(tools=["f"]), "tools[0]"),
        (_with(tools=[{"name": "f"}]), "tools[0].input_schema"),
        (_with(tools=[{"input_schema": {}}]), "tools[0].name"),
        (_with(tool_choice="auto"), "'tool_choice'"),
        (_with(tool_choice={"type": "sometimes"}), "tool_choice.type"),
        (_with(tool_choice={"type": "tool"}), "tool_choice.name"),
        (_with(tool_choice={"type": "auto", "disable_parallel_tool_use": 1}), "disable_parallel_tool_use"),
        (_with(thinking={"type": "deep"}), "thinking.type"),
        (_with(thinking={"type": "enabled"}), "thinking.budget_tokens"),
        (_with(stop_sequences="END"), "'stop_sequences'"),
        (_with(stop_sequences=["END", 1]), "stop_sequences[1]"),
        (_with(temperature="hot"), "'temperature'"),
        (_with(temperature=True), "'temperature'"),
        (_with(top_k=2.5), "'top_k'"),
        (_with(stream="yes"), "'stream'"),
        (_with(metadata=["u"]), "'metadata'"),
    ],
)
def test_invalid_bodies_name_the_field(body: Any, named: str) -> None:
    with pytest.raises(GatewayError) as caught:
        parse(body)
    assert caught.value.kind == "invalid_request"
    assert named in caught.value.message


# ---------------------------------------------------------------------------------------------
# request parsing


def test_request_fields() -> None:
    gateway = answering(result("ok"))
    gateway.client().messages.create(
        model=MODEL,
        max_tokens=256,
        system=[
            {"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
            {"type": "text", "text": "Be brief."},
        ],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": EPHEMERAL}]}],
        stop_sequences=["END"],
        metadata={"user_id": "u1"},
        # This SDK version no longer offers the sampling knobs, but Claude Code and others still send them.
        extra_body={
            "temperature": 0.2,
            "top_p": 0.9,
            "top_k": 5,
            "service_tier": "auto",
            "container": "c1",
            "context_management": {"edits": []},
        },
    )
    request = gateway.requests[0]
    assert request.model == MODEL and request.stream is False
    assert request.messages == [
        Message(role="system", content=[TextPart(text="You are Claude Code."), TextPart(text="Be brief.")]),
        Message(role="user", content=[TextPart(text="Hi")]),
    ]
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (256, 0.2, 0.9, 5)
    assert sampling.stop == ["END"]
    assert request.metadata == {"user_id": "u1"}


def test_tools_choice_and_server_tools() -> None:
    gateway = answering(result("ok"))
    gateway.client().messages.create(
        **create_kwargs(
            tools=[
                {**WEATHER_TOOL, "cache_control": EPHEMERAL, "strict": True},
                {"type": "custom", "name": "noop", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
                {"type": "bash_20250124", "name": "bash"},
            ],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
        )
    )
    request = gateway.requests[0]
    assert [(t.name, t.description) for t in request.tools] == [("get_weather", "Weather for a city"), ("noop", None)]
    assert request.tools[0].parameters == WEATHER_TOOL["input_schema"]
    assert gateway.parsed[0].rewrites == [
        "server tool not offered to the model: web_search",
        "server tool not offered to the model: bash",
    ]
    assert (request.tool_choice.mode, request.parallel_tool_calls) == ("required", False)


@pytest.mark.parametrize(
    ("choice", "mode", "name", "parallel"),
    [
        ({"type": "auto"}, "auto", None, None),
        ({"type": "auto", "disable_parallel_tool_use": False}, "auto", None, True),
        ({"type": "none"}, "none", None, None),
        ({"type": "any"}, "required", None, None),
        ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, "tool", "get_weather", False),
    ],
)
def test_tool_choice(choice: dict, mode: str, name: str | None, parallel: bool | None) -> None:
    request = parse(_with(tool_choice=choice))
    assert (request.tool_choice.mode, request.tool_choice.name, request.parallel_tool_calls) == (mode, name, parallel)


@pytest.mark.parametrize(
    ("thinking", "enabled", "budget"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, True, 2048),
        ({"type": "adaptive"}, True, None),
        ({"type": "disabled"}, False, None),
        (None, None, None),
    ],
)
def test_thinking_config(thinking: dict | None, enabled: bool | None, budget: int | None) -> None:
    request = parse(_with(thinking=thinking if thinking else ...))
    assert (request.thinking.enabled, request.thinking.budget_tokens) == (enabled, budget)


def test_output_config_effort_and_schema_are_read_leniently() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    config = {"effort": "high", "format": {"type": "json_schema", "schema": schema}}
    request = parse(_with(output_config=config))
    assert (request.thinking.effort, request.response_schema) == ("high", schema)
    odd = parse(_with(output_config={"effort": 3, "format": "json"}))
    assert (odd.thinking.effort, odd.response_schema) == (None, None)


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def test_multi_turn_history_round_trips_signatures() -> None:
    first = result("Let me look.", reasoning=THOUGHT, calls=[PARIS, TOKYO], finish="tool_calls")
    gateway = AnthropicGateway(lambda request: first if len(request.messages) == 1 else result("Done."))
    client = gateway.client()
    question = {
        "role": "user",
        "content": [
            {"type": "text", "text": "Weather in Paris and Tokyo? See the map."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ],
    }
    with client.messages.stream(model=MODEL, max_tokens=1024, messages=[question], tools=[WEATHER_TOOL]) as stream:
        turn = stream.get_final_message()
    history = [
        question,
        # Claude Code sends the assistant turn back as it received it.
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in turn.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_paris",
                    "content": [
                        {"type": "text", "text": "15C sunny"},
                        {"type": "image", "source": {"type": "url", "url": "https://example.invalid/sky.png"}},
                    ],
                },
                {"type": "tool_result", "tool_use_id": "call_tokyo", "content": "service down", "is_error": True},
                {"type": "text", "text": "Be quick."},
            ],
        },
        {"role": "system", "content": "Reminder: answer in one line."},
        {
            "role": "assistant",
            "content": [{"type": "redacted_thinking", "data": "opaque=="}, {"type": "text", "text": "Ok"}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_missing"}]},
    ]
    final = client.messages.create(model=MODEL, max_tokens=1024, messages=history, tools=[WEATHER_TOOL])
    assert final.content[0].text == "Done."

    messages = gateway.requests[-1].messages
    signature = turn.content[0].signature
    # The echoed input object is re-serialised the way chat templates' tojson writes it.
    paris_arguments = json.dumps(PARIS.arguments_obj(), ensure_ascii=False)
    assert verify(THOUGHT, signature)
    assert messages == [
        Message(
            role="user",
            content=[
                TextPart(text="Weather in Paris and Tokyo? See the map."),
                ImagePart(media_type="image/png", data=PNG),
            ],
        ),
        Message(
            role="assistant",
            content=[TextPart(text="Let me look.")],
            reasoning=[Reasoning(text=THOUGHT, signature=signature)],
            tool_calls=[
                ToolCall(id="call_paris", name="get_weather", arguments=paris_arguments),
                ToolCall(id="call_tokyo", name="get_weather", arguments='{"city": "Tokyo"}'),
            ],
        ),
        Message(
            role="tool",
            tool_call_id="call_paris",
            name="get_weather",
            content=[TextPart(text="15C sunny"), ImagePart(url="https://example.invalid/sky.png")],
        ),
        Message(
            role="tool",
            tool_call_id="call_tokyo",
            name="get_weather",
            content=[TextPart(text="service down")],
            is_error=True,
        ),
        Message(role="user", content=[TextPart(text="Be quick.")]),
        Message(role="system", content=[TextPart(text="Reminder: answer in one line.")]),
        Message(
            role="assistant",
            content=[TextPart(text="Ok")],
            reasoning=[Reasoning(text="opaque==", redacted=True)],
        ),
        Message(role="tool", tool_call_id="call_missing", content=[TextPart(text="")]),
    ]


def test_omitted_thinking_display_seals_the_text_into_the_signature() -> None:
    gateway = AnthropicGateway(lambda request: result("Answer.", reasoning=THOUGHT))
    client = gateway.client()
    thinking = {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}
    with client.messages.stream(model=MODEL, max_tokens=2048, messages=USER_HI, thinking=thinking) as stream:
        turn = stream.get_final_message()
    assert gateway.parsed[0].context == AnthropicContext(thinking_display="omitted")
    block = turn.content[0]
    assert block.type == "thinking" and block.thinking == "" and unseal(block.signature) == THOUGHT

    history = [*USER_HI, {"role": "assistant", "content": [b.model_dump() for b in turn.content]}, *USER_HI]
    client.messages.create(model=MODEL, max_tokens=2048, messages=history, thinking=thinking)
    assert gateway.requests[1].messages[1].reasoning == [Reasoning(text=THOUGHT, signature=seal(THOUGHT))]


def test_server_tool_blocks_in_history_are_dropped() -> None:
    body = _with(
        messages=[
            {"role": "user", "content": "search it"},
            {
                "role": "assistant",
                "content": [
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                    {"type": "text", "text": "Found it."},
                ],
            },
        ]
    )
    messages = parse(body).messages
    assert messages[1] == Message(role="assistant", content=[TextPart(text="Found it.")])


def test_documents_become_text() -> None:
    body = _user(
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain notes"}},
        {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "inner"}]}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}},
        {"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": "hit"}]},
    )
    texts = [p.text for p in parse(body).messages[0].content]
    assert texts[:2] == ["plain notes", "inner"] and texts[3] == "hit"
    assert "application/pdf" in texts[2] and "omitted" in texts[2]


# ---------------------------------------------------------------------------------------------
# fuzzing: whatever JSON arrives, parse answers with a ChatRequest or a clean invalid_request

JSON = json_values(text=5, leaves=8, ints=st.integers(-3, 3))

RICH = {
    "model": MODEL,
    "max_tokens": 64,
    "system": [{"type": "text", "text": "s"}],
    "tools": [WEATHER_TOOL],
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image", "source": URL_SOURCE}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "tool_use", "id": "a", "name": "get_weather", "input": {"city": "P"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "r"}]},
    ],
}


def _parse_cleanly(body: Any) -> None:
    try:
        parse(body)
    except GatewayError as error:
        assert error.kind == "invalid_request" and error.message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_fuzz_any_json(body: Any) -> None:
    _parse_cleanly(body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(paths(RICH)), JSON)
def test_fuzz_one_field_replaced(path: tuple, new: Any) -> None:
    _parse_cleanly(replace(RICH, path, new))


BILLING = "x-anthropic-billing-header: cc_version=2.1.330.d9e; cc_entrypoint=sdk-cli; cc_prev_req=req_{}; cch=0a1b2;"


@pytest.mark.parametrize("shape", ["own block", "first line of a block", "string"])
def test_claude_codes_billing_line_is_not_part_of_the_prompt(shape: str) -> None:
    """Its values change per request; kept, no turn of a Claude Code session could continue the last."""
    prompt = "You are Claude Code.\nBe brief."

    def system(request_no: int) -> Any:
        line = BILLING.format(request_no)
        if shape == "own block":
            return [{"type": "text", "text": line}, {"type": "text", "text": prompt}]
        if shape == "first line of a block":
            return [{"type": "text", "text": f"{line}\n{prompt}"}]
        return f"{line}\n{prompt}"

    first, second = (parse(_with(system=system(n))) for n in (1, 2))
    assert first.messages == second.messages
    assert first.messages[0].role == "system"
    assert [p.text for p in first.messages[0].content] == [prompt]
    # Elsewhere the same words are the user's own text, kept as sent.
    kept = parse(_user({"type": "text", "text": BILLING.format(3)}))
    assert kept.messages[0].content[0].text == BILLING.format(3)
