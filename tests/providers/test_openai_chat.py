"""OpenAI Chat Completions provider, exercised through the official `openai` SDK.

The SDK talks to `FakeGateway` over an httpx MockTransport: a named test double for polar's
gateway that runs the provider's real parse → render around a scripted `ChatResult`, so every
assertion is about bytes the real SDK parsed (stream parser and stream helpers included).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from hypothesis import given, settings
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
from polar.errors import GatewayError
from polar.providers.base import Parsed
from polar.providers.openai_chat import ChatContext, OpenAIChat
from polar.providers.openai_common import deltas
from tests.providers.support import PROVIDERS
from tests.support.fuzz import json_values

PROVIDER: OpenAIChat = PROVIDERS.by_name["openai_chat"]
ROUTE = PROVIDER.match("POST", "/v1/chat/completions", {}, {})
USAGE = Usage(prompt_tokens=21, completion_tokens=9, cached_tokens=4, reasoning_tokens=3)


def parse(body) -> ChatRequest:
    return PROVIDER.parse(ROUTE, body).request


def result(**fields) -> ChatResult:
    return ChatResult(**{"id": "c0ffee", "model": "vllm-model", "created": 1_700_000_000, "usage": USAGE, **fields})


class FakeGateway:
    """Test double for the gateway: parse the SDK's request, answer with a scripted result or error."""

    def __init__(self, answer: ChatResult | None = None, error: GatewayError | None = None):
        self.answer = answer or result(content="Hello there, world.")
        self.error = error
        self.requests: list[ChatRequest] = []
        self.parsed: list[Parsed[ChatContext]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/v1/models":
            reply = PROVIDER.render_models(["qwen3", "qwen3-coder"])
            return httpx.Response(reply.status, content=reply.body, headers=reply.headers)
        route = PROVIDER.match(request.method, request.url.path, dict(request.url.params), dict(request.headers))
        assert route is not None and route.endpoint == "generate"
        try:
            parsed = PROVIDER.parse(route, json.loads(request.content))
            self.parsed.append(parsed)
            self.requests.append(parsed.request)
            if self.error is not None:
                raise self.error
            reply = PROVIDER.render(route, parsed.context, parsed.request, self.answer)
        except GatewayError as error:
            reply = PROVIDER.render_error(error)
        return httpx.Response(reply.status, content=reply.body, headers=reply.headers)

    def client(self) -> openai.OpenAI:
        transport = httpx.MockTransport(self.handle)
        return openai.OpenAI(
            api_key="k", base_url="http://polar.test/v1", max_retries=0, http_client=httpx.Client(transport=transport)
        )

    def async_client(self) -> openai.AsyncOpenAI:
        transport = httpx.MockTransport(self.handle)
        return openai.AsyncOpenAI(
            api_key="k",
            base_url="http://polar.test/v1",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),
        )


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TWO_CALLS = [
    ToolCall(id="call_a", name="get_weather", arguments='{"city": "Paris"}'),
    ToolCall(id="call_b", name="get_weather", arguments='{"city": "Tokyo, the capital of Japan, a long name"}'),
]


# --- routing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/chat/completions/",
        "/chat/completions",
        "/api/v1/chat/completions",
        "/v1beta/openai/chat/completions",
        "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21",
    ],
)
def test_matches_chat_completions_paths(path):
    route = PROVIDER.match("POST", path, {}, {})
    assert route is not None and route.provider is PROVIDER and route.endpoint == "generate"


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/responses")]
)
def test_ignores_other_endpoints(method, path):
    assert PROVIDER.match(method, path, {}, {}) is None


# --- non-streamed answers ------------------------------------------------------------------


def test_text_answer_and_parsed_request():
    gateway = FakeGateway()
    completion = gateway.client().chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_completion_tokens=64,
        temperature=0.2,
        top_p=0.9,
        stop="###",
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=0.25,
    )
    assert completion.id == "chatcmpl-c0ffee"
    assert completion.model == "gpt-4o"  # the name the client asked for
    choice = completion.choices[0]
    assert choice.message.content == "Hello there, world."
    assert choice.finish_reason == "stop"
    assert completion.usage.prompt_tokens == 21 and completion.usage.total_tokens == 30
    assert completion.usage.prompt_tokens_details.cached_tokens == 4
    assert completion.usage.completion_tokens_details.reasoning_tokens == 3

    request = gateway.requests[0]
    assert [m.role for m in request.messages] == ["system", "user"]
    assert request.messages[0].text() == "Be brief."
    s = request.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.stop, s.seed) == (64, 0.2, 0.9, ["###"], 7)
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, 0.25)
    assert request.stream is False


def test_tool_call_answer():
    gateway = FakeGateway(result(tool_calls=TWO_CALLS[:1], finish_reason="tool_calls"))
    completion = gateway.client().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
    )
    message = completion.choices[0].message
    assert message.content is None
    assert completion.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_a", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    request = gateway.requests[0]
    assert request.tools[0].name == "get_weather"
    assert request.tools[0].parameters["required"] == ["city"]
    assert (request.tool_choice.mode, request.tool_choice.name) == ("tool", "get_weather")
    assert request.parallel_tool_calls is False


def test_tool_calls_force_tool_calls_finish_reason():
    completion = (
        FakeGateway(result(tool_calls=TWO_CALLS, finish_reason="stop"))
        .client()
        .chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=[WEATHER_TOOL])
    )
    assert completion.choices[0].finish_reason == "tool_calls"
    assert [c.id for c in completion.choices[0].message.tool_calls] == ["call_a", "call_b"]


@pytest.mark.parametrize(
    ("canonical", "wire"), [("stop_sequence", "stop"), ("length", "length"), ("content_filter", "content_filter")]
)
def test_finish_reasons(canonical, wire):
    completion = (
        FakeGateway(result(content="x", finish_reason=canonical))
        .client()
        .chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    )
    assert completion.choices[0].finish_reason == wire


def test_reasoning_answer_and_effort():
    gateway = FakeGateway(result(content="42", reasoning=Reasoning(text="Six times seven.")))
    completion = gateway.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "6*7?"}], reasoning_effort="high"
    )
    extra = completion.choices[0].message.model_extra
    assert extra["reasoning"] == extra["reasoning_content"] == "Six times seven."
    thinking = gateway.requests[0].thinking
    assert (thinking.enabled, thinking.effort) == (True, "high")


@pytest.mark.parametrize(
    ("body", "enabled", "effort"),
    [
        ({"reasoning_effort": "none"}, False, "none"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False, None),
        ({"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}}, False, "low"),
        ({}, None, None),
    ],
)
def test_thinking_switches(body, enabled, effort):
    request = parse({"model": "m", "messages": [{"role": "user", "content": "x"}], **body})
    assert (request.thinking.enabled, request.thinking.effort) == (enabled, effort)


def test_template_kwargs_other_than_enable_thinking_are_reported_as_ignored():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    kwargs = {"enable_thinking": True, "reasoning_budget": 9, "add_vision_id": True}
    parsed = PROVIDER.parse(ROUTE, {**body, "chat_template_kwargs": kwargs})
    assert parsed.request.thinking.enabled is True
    assert parsed.rewrites == ["chat_template_kwargs ignored: add_vision_id, reasoning_budget"]
    assert PROVIDER.parse(ROUTE, {**body, "chat_template_kwargs": {"enable_thinking": False}}).rewrites == []


def test_response_format_json_schema():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    request = parse(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "out", "schema": schema, "strict": True},
            },
        },
    )
    assert request.response_schema == schema
    plain = parse({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}})
    assert plain.response_schema is None


# --- streamed answers ----------------------------------------------------------------------


def test_stream_chunks_with_usage():
    gateway = FakeGateway(result(content="Hello there, world.", reasoning=Reasoning(text="Greet them warmly.")))
    stream = gateway.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert gateway.requests[0].stream and gateway.parsed[0].context == ChatContext(include_usage=True)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {"chatcmpl-c0ffee"}
    body = [c for c in chunks if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in body)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning", "") for c in body)
    assert content == "Hello there, world."
    assert reasoning == "Greet them warmly."
    assert len([c for c in body if c.choices[0].delta.content]) > 1  # really streamed in pieces
    assert body[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 30


def test_stream_without_usage_has_no_usage_chunk():
    chunks = list(
        FakeGateway()
        .client()
        .chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], stream=True)
    )
    assert all(c.choices for c in chunks)
    assert "usage" not in chunks[0].model_fields_set


def test_stream_parallel_tool_call_deltas():
    gateway = FakeGateway(result(tool_calls=TWO_CALLS, finish_reason="tool_calls"))
    chunks = list(
        gateway.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], tools=[WEATHER_TOOL], stream=True
        )
    )
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    openings = [d for d in deltas if d.id]
    assert [(d.index, d.id, d.type, d.function.name, d.function.arguments) for d in openings] == [
        (0, "call_a", "function", "get_weather", ""),
        (1, "call_b", "function", "get_weather", ""),
    ]
    for index, call in enumerate(TWO_CALLS):
        assert "".join(d.function.arguments for d in deltas if d.index == index) == call.arguments
    assert all(d.id is None and d.function.name is None for d in deltas if d not in openings)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_stream_helper_final_completion():
    gateway = FakeGateway(result(content="Let me check.", reasoning=Reasoning(text="Need data."), tool_calls=TWO_CALLS))
    with gateway.client().chat.completions.stream(
        model="m", messages=[{"role": "user", "content": "x"}], tools=[WEATHER_TOOL]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "content.done" in kinds and kinds.count("tool_calls.function.arguments.done") == 2
    message = final.choices[0].message
    assert message.content == "Let me check."
    assert [(c.id, c.function.arguments) for c in message.tool_calls] == [(c.id, c.arguments) for c in TWO_CALLS]
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.model_extra["reasoning"] == "Need data."


def test_async_client_stream_and_create():
    gateway = FakeGateway(result(content="async hello", tool_calls=TWO_CALLS[:1], finish_reason="tool_calls"))

    async def run():
        client = gateway.async_client()
        completion = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        chunks = [chunk async for chunk in stream]
        return completion, chunks

    completion, chunks = asyncio.run(run())
    assert completion.choices[0].message.tool_calls[0].id == "call_a"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "async hello"


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "exc", "status", "code"),
    [
        (
            GatewayError("context_length", "prompt is 9000 tokens, limit 8192"),
            openai.BadRequestError,
            400,
            "context_length_exceeded",
        ),
        (GatewayError("not_found", "model 'x' does not exist", param="model"), openai.NotFoundError, 404, None),
        (GatewayError("authentication", "bad key"), openai.AuthenticationError, 401, "invalid_api_key"),
        (GatewayError("rate_limit", "slow down"), openai.RateLimitError, 429, "rate_limit_exceeded"),
        (GatewayError("upstream_unavailable", "vLLM is down"), openai.InternalServerError, 503, None),
        (GatewayError("internal", "bug"), openai.InternalServerError, 500, None),
    ],
)
def test_errors_map_to_sdk_exceptions(error, exc, status, code):
    with pytest.raises(exc) as caught:
        FakeGateway(error=error).client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == status
    assert caught.value.code == code
    assert caught.value.body["message"] == error.message
    assert caught.value.param == error.param


def test_streamed_request_error_is_raised_by_sdk():
    with pytest.raises(openai.BadRequestError) as caught:
        FakeGateway().client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True, n=2
        )
    assert caught.value.param == "n" and caught.value.type == "invalid_request_error"


# --- history parsing -----------------------------------------------------------------------

PNG = "iVBORw0KGgo="


def test_multi_turn_history_parses_to_canonical_messages():
    gateway = FakeGateway()
    gateway.client().chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "You are "}, {"type": "text", "text": "a bot."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in these?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "low"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Look at both images.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "describe", "arguments": '{"n": 1}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "describe", "arguments": '{"n": 2}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a dog"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "a cat"}]},
            {"role": "assistant", "content": "A dog and a cat.", "reasoning": "Summarise."},
            {"role": "user", "content": "Thanks"},
        ],
    )
    assert gateway.requests[0].messages == [
        Message(role="system", content=[TextPart(text="You are "), TextPart(text="a bot.")]),
        Message(
            role="user",
            content=[
                TextPart(text="What is in these?"),
                ImagePart(media_type="image/png", data=PNG),
                ImagePart(url="https://example.com/cat.jpg"),
            ],
        ),
        Message(
            role="assistant",
            reasoning=[Reasoning(text="Look at both images.")],
            tool_calls=[
                ToolCall(id="call_1", name="describe", arguments='{"n": 1}'),
                ToolCall(id="call_2", name="describe", arguments='{"n": 2}'),
            ],
        ),
        Message(role="tool", tool_call_id="call_1", name="describe", content=[TextPart(text="a dog")]),
        Message(role="tool", tool_call_id="call_2", name="describe", content=[TextPart(text="a cat")]),
        Message(
            role="assistant", content=[TextPart(text="A dog and a cat.")], reasoning=[Reasoning(text="Summarise.")]
        ),
        Message(role="user", content=[TextPart(text="Thanks")]),
    ]


def _body(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([1, 2], "request body"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            },
            "messages[0].content[0].type",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,xx"}}]}
                ],
            },
            "messages[0].content[0].image_url.url",
        ),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        (
            {
                "model": "m",
                "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}],
            },
            "messages[0].tool_calls[0].function.name",
        ),
        ({"model": "m", "messages": [{"role": "assistant", "tool_calls": "nope"}]}, "messages[0].tool_calls"),
        ({"model": "m", "messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
        (_body(functions=[{"name": "f"}]), "functions"),
        (_body(n=3), "n"),
        (_body(stop=[1]), "stop"),
        (_body(temperature="hot"), "temperature"),
        (_body(top_p=10**400), "top_p"),
        (_body(max_tokens=True), "max_tokens"),
        (_body(stream="yes"), "stream"),
        (_body(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tools[0].type"),
        (
            _body(tools=[{"type": "function", "function": {"name": "f", "parameters": "none"}}]),
            "tools[0].function.parameters",
        ),
        (_body(tool_choice="sometimes"), "tool_choice"),
        (_body(response_format={"type": "yaml"}), "response_format.type"),
        (
            _body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
            "response_format.json_schema.schema",
        ),
        (_body(reasoning_effort=3), "reasoning_effort"),
        (_body(chat_template_kwargs={"enable_thinking": "no"}), "chat_template_kwargs.enable_thinking"),
    ],
)
def test_invalid_requests_name_the_field(body, field):
    with pytest.raises(GatewayError) as caught:
        parse(body)
    assert caught.value.kind == "invalid_request"
    assert field in caught.value.message


JSON = json_values()
ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "x"])
MESSAGE = st.fixed_dictionaries(
    {"role": ROLES},
    optional={"content": JSON | st.text(), "tool_calls": JSON, "tool_call_id": JSON, "reasoning": JSON},
)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        JSON,
        st.fixed_dictionaries(
            {"model": st.text(), "messages": st.lists(MESSAGE, max_size=3)},
            optional={
                k: JSON
                for k in (
                    "tools",
                    "tool_choice",
                    "stop",
                    "n",
                    "response_format",
                    "stream_options",
                    "temperature",
                    "max_tokens",
                    "seed",
                    "reasoning_effort",
                    "chat_template_kwargs",
                )
            },
        ),
    )
)
def test_any_body_parses_or_fails_cleanly(body):
    try:
        assert isinstance(parse(body), ChatRequest)
    except GatewayError as error:
        assert error.kind == "invalid_request" and error.message


@given(st.text())
def test_stream_pieces_rebuild_the_text(text):
    cut = deltas(text)
    assert "".join(cut) == text and all(cut) and all(len(p) <= 32 for p in cut)


def test_models_listing_through_sdk():
    models = FakeGateway().client().models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [
        ("qwen3", "model", "polar"),
        ("qwen3-coder", "model", "polar"),
    ]


def test_count_is_not_a_chat_endpoint():
    with pytest.raises(NotImplementedError):
        PROVIDER.render_count(ROUTE, 3)
