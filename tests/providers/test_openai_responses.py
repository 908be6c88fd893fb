"""OpenAI Responses provider, exercised through the official `openai` SDK and Codex's SSE contract.

The SDK talks to `FakeGateway` over an httpx MockTransport: a named test double for polar's
gateway that runs the provider's real parse → render around a scripted `ChatResult`.
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
from polar.providers.openai_responses import OpenAIResponses, ResponsesContext
from tests.providers.support import PROVIDERS, SEALER
from tests.support.fuzz import json_values

PROVIDER: OpenAIResponses = PROVIDERS.by_name["openai_responses"]
seal = SEALER.seal
GENERATE = PROVIDER.match("POST", "/v1/responses", {}, {})
USAGE = Usage(prompt_tokens=120, completion_tokens=30, cached_tokens=64, reasoning_tokens=12)
ENCRYPTED = ["reasoning.encrypted_content"]


def parse(body) -> ChatRequest:
    return PROVIDER.parse(GENERATE, body).request


def result(**fields) -> ChatResult:
    return ChatResult(**{"id": "beef01", "model": "vllm-model", "created": 1_700_000_000, "usage": USAGE, **fields})


class FakeGateway:
    """Test double for the gateway: parse the SDK's request, answer with a scripted result or error."""

    def __init__(self, answer: ChatResult | None = None, error: GatewayError | None = None, input_tokens: int = 0):
        self.answer = answer or result(content="Hello there, world.")
        self.error = error
        self.input_tokens = input_tokens
        self.requests: list[ChatRequest] = []
        self.parsed: list[Parsed[ResponsesContext]] = []
        self.bodies: list[bytes] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        route = PROVIDER.match(request.method, request.url.path, dict(request.url.params), dict(request.headers))
        assert route is not None
        try:
            parsed = PROVIDER.parse(route, json.loads(request.content))
            self.parsed.append(parsed)
            self.requests.append(parsed.request)
            if self.error is not None:
                raise self.error
            if route.endpoint == "count_tokens":
                reply = PROVIDER.render_count(route, self.input_tokens)
            else:
                reply = PROVIDER.render(route, parsed.context, parsed.request, self.answer)
        except GatewayError as error:
            reply = PROVIDER.render_error(error)
        self.bodies.append(reply.body)
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


SHELL_TOOL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}},
}
PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" body "*** End Patch"'},
}
TWO_CALLS = [
    ToolCall(id="call_ls", name="shell", arguments='{"command": ["ls", "-la"]}'),
    ToolCall(id="call_pwd", name="shell", arguments='{"command": ["pwd"]}'),
]
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch"


def sse_events(body: bytes) -> list[tuple[str, dict]]:
    """(event line, data) pairs of a raw SSE body."""
    events = []
    for block in body.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


# --- routing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/v1/responses", "/v1/responses/", "/responses", "/backend-api/codex/responses", "/openai/v1/responses"]
)
def test_matches_responses_paths(path):
    route = PROVIDER.match("POST", path, {}, {"upgrade": "websocket"})
    assert route is not None and route.provider is PROVIDER and route.endpoint == "generate"


def test_matches_input_tokens_as_count():
    assert PROVIDER.match("POST", "/v1/responses/input_tokens", {}, {}).endpoint == "count_tokens"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/responses"),
        ("GET", "/v1/responses/resp_1"),
        ("POST", "/v1/responses/compact"),
        ("POST", "/v1/chat/completions"),
    ],
)
def test_ignores_other_endpoints(method, path):
    assert PROVIDER.match(method, path, {}, {}) is None


# --- non-streamed answers ------------------------------------------------------------------


def test_text_answer_and_parsed_request():
    gateway = FakeGateway()
    response = gateway.client().responses.create(
        model="gpt-5",
        instructions="Be brief.",
        input="Hi",
        max_output_tokens=256,
        temperature=0.3,
        top_p=0.8,
        store=False,
        metadata={"run": "7"},
        prompt_cache_key="thread-1",
    )
    assert response.id == "resp_beef01"
    assert response.status == "completed" and response.model == "gpt-5"
    assert response.output_text == "Hello there, world."
    assert response.instructions == "Be brief." and response.store is False and response.metadata == {"run": "7"}
    assert response.usage.input_tokens == 120 and response.usage.total_tokens == 150
    assert response.usage.input_tokens_details.cached_tokens == 64
    assert response.usage.output_tokens_details.reasoning_tokens == 12

    request = gateway.requests[0]
    assert request.messages == [
        Message(role="system", content=[TextPart(text="Be brief.")]),
        Message(role="user", content=[TextPart(text="Hi")]),
    ]
    assert (request.sampling.max_tokens, request.sampling.temperature, request.sampling.top_p) == (256, 0.3, 0.8)
    assert request.stream is False


def test_function_call_answer():
    gateway = FakeGateway(result(tool_calls=TWO_CALLS[:1], finish_reason="tool_calls"))
    response = gateway.client().responses.create(
        model="m",
        input="List files",
        tools=[SHELL_TOOL],
        tool_choice={"type": "function", "name": "shell"},
        parallel_tool_calls=False,
    )
    (call,) = response.output
    assert call.type == "function_call" and call.status == "completed"
    assert (call.call_id, call.name, call.arguments) == ("call_ls", "shell", TWO_CALLS[0].arguments)
    assert call.id.startswith("fc_")
    assert response.parallel_tool_calls is False
    assert response.tools[0].name == "shell"

    request = gateway.requests[0]
    assert request.tools[0].name == "shell" and request.tools[0].parameters == SHELL_TOOL["parameters"]
    assert (request.tool_choice.mode, request.tool_choice.name) == ("tool", "shell")
    assert request.parallel_tool_calls is False


def test_parallel_function_calls_after_text():
    response = (
        FakeGateway(result(content="Checking.", tool_calls=TWO_CALLS, finish_reason="tool_calls"))
        .client()
        .responses.create(model="m", input="x", tools=[SHELL_TOOL])
    )
    assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
    assert [item.call_id for item in response.output[1:]] == ["call_ls", "call_pwd"]
    assert len({item.id for item in response.output}) == 3


def test_reasoning_item_with_encrypted_content():
    gateway = FakeGateway(result(content="42", reasoning=Reasoning(text="Six times seven.")))
    response = gateway.client().responses.create(
        model="m", input="6*7?", reasoning={"effort": "high", "summary": "auto"}, include=ENCRYPTED
    )
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert [s.text for s in reasoning.summary] == ["Six times seven."]
    assert [c.text for c in reasoning.content] == ["Six times seven."]
    assert reasoning.encrypted_content == seal("Six times seven.")
    assert message.content[0].text == "42"
    assert response.reasoning.effort == "high"
    request = gateway.requests[0]
    assert (request.thinking.enabled, request.thinking.effort) == (True, "high")
    assert gateway.parsed[0].context.include == tuple(ENCRYPTED)


def test_no_encrypted_content_unless_included():
    response = (
        FakeGateway(result(content="42", reasoning=Reasoning(text="hmm")))
        .client()
        .responses.create(model="m", input="x")
    )
    assert response.output[0].encrypted_content is None


def test_length_cut_is_incomplete():
    response = (
        FakeGateway(result(content="Once upon a", finish_reason="length"))
        .client()
        .responses.create(model="m", input="story", max_output_tokens=3)
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.max_output_tokens == 3


def test_custom_tool_round_trip():
    gateway = FakeGateway(
        result(tool_calls=[ToolCall(id="call_p", name="apply_patch", arguments=json.dumps({"input": PATCH}))])
    )
    response = gateway.client().responses.create(model="m", input="add a.txt", tools=[SHELL_TOOL, PATCH_TOOL])
    (call,) = response.output
    assert call.type == "custom_tool_call"
    assert (call.call_id, call.name, call.input) == ("call_p", "apply_patch", PATCH)

    tool = gateway.requests[0].tools[1]
    assert tool.name == "apply_patch" and tool.parameters["required"] == ["input"]
    assert PATCH_TOOL["format"]["definition"] in tool.parameters["properties"]["input"]["description"]
    assert gateway.parsed[0].context.custom_tools == {"apply_patch"}


def test_input_tokens_count():
    gateway = FakeGateway(input_tokens=77)
    counted = gateway.client().responses.input_tokens.count(input="How many tokens?", instructions="Count.")
    assert (counted.object, counted.input_tokens) == ("response.input_tokens", 77)
    assert gateway.requests[0].model == "" and len(gateway.requests[0].messages) == 2


# --- streamed answers ----------------------------------------------------------------------


def test_stream_event_sequence():
    gateway = FakeGateway(result(content="Hi there friend", reasoning=Reasoning(text="Be nice."), tool_calls=TWO_CALLS))
    events = list(
        gateway.client().responses.create(model="m", input="x", tools=[SHELL_TOOL], stream=True, include=ENCRYPTED)
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    message_kinds = [k for k in kinds if k.startswith(("response.content_part", "response.output_text"))]
    assert message_kinds[0] == "response.content_part.added" and message_kinds[-1] == "response.content_part.done"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hi there friend"
    assert "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta") == "Be nice."
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Be nice."
    for index, call in enumerate(TWO_CALLS, start=2):
        deltas = [
            e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.output_index == index
        ]
        assert "".join(deltas) == call.arguments
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    assert final.id == "resp_beef01" and final.usage.total_tokens == 150 and len(final.output) == 4


def test_stream_helper_final_response():
    gateway = FakeGateway(result(content="Done.", reasoning=Reasoning(text="Think."), tool_calls=TWO_CALLS))
    with gateway.client().responses.stream(model="m", input="x", tools=[SHELL_TOOL]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.output_text.done" in kinds
    assert final.output_text == "Done."
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call", "function_call"]
    assert [item.arguments for item in final.output[2:]] == [c.arguments for c in TWO_CALLS]


def test_stream_custom_tool_call_input_events():
    gateway = FakeGateway(
        result(tool_calls=[ToolCall(id="call_p", name="apply_patch", arguments=json.dumps({"input": PATCH}))])
    )
    events = list(gateway.client().responses.create(model="m", input="x", tools=[PATCH_TOOL], stream=True))
    assert "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta") == PATCH
    done = [e for e in events if e.type == "response.output_item.done"]
    assert done[0].item.type == "custom_tool_call" and done[0].item.input == PATCH


def test_stream_length_cut_completes_with_incomplete_status():
    gateway = FakeGateway(result(content="Once upon", finish_reason="length"))
    events = list(gateway.client().responses.create(model="m", input="x", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.status == "incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    with gateway.client().responses.stream(model="m", input="x") as stream:  # the SDK helper accepts it
        assert stream.get_final_response().output_text == "Once upon"


def test_stream_meets_codex_sse_contract():
    """What Codex's SSE reader needs: `event:` lines, parseable output_item.done items, completed id and usage."""
    gateway = FakeGateway(result(content="ok", reasoning=Reasoning(text="r"), tool_calls=TWO_CALLS))
    list(gateway.client().responses.create(model="m", input="x", stream=True, include=ENCRYPTED, tools=[SHELL_TOOL]))
    events = sse_events(gateway.bodies[0])
    assert all(name == data["type"] for name, data in events)
    items = [data["item"] for name, data in events if name == "response.output_item.done"]
    reasoning, message, *calls = items
    assert (
        isinstance(reasoning["id"], str) and isinstance(reasoning["summary"], list) and reasoning["encrypted_content"]
    )
    assert message["role"] == "assistant" and message["content"][0] == {
        "type": "output_text",
        "text": "ok",
        "annotations": [],
        "logprobs": [],
    }
    assert all(isinstance(c[k], str) for c in calls for k in ("name", "arguments", "call_id"))
    deltas = [data for name, data in events if name.startswith("response.reasoning_")]
    assert all("summary_index" in d or "content_index" in d for d in deltas)
    name, completed = events[-1]
    assert name == "response.completed" and completed["response"]["id"] == "resp_beef01"
    usage = completed["response"]["usage"]
    assert all(isinstance(usage[k], int) for k in ("input_tokens", "output_tokens", "total_tokens"))


def test_async_client_stream():
    gateway = FakeGateway(result(content="async hello", tool_calls=TWO_CALLS[:1]))

    async def run():
        client = gateway.async_client()
        stream = await client.responses.create(model="m", input="x", stream=True)
        events = [event async for event in stream]
        async with client.responses.stream(model="m", input="x") as helper:
            final = await helper.get_final_response()
        return events, final

    events, final = asyncio.run(run())
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "async hello"
    assert final.output[-1].call_id == "call_ls"


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "exc", "status", "code"),
    [
        (
            GatewayError("context_length", "input is 300000 tokens, limit 262144"),
            openai.BadRequestError,
            400,
            "context_length_exceeded",
        ),
        (GatewayError("not_found", "no such model", param="model"), openai.NotFoundError, 404, None),
        (GatewayError("rate_limit", "slow down"), openai.RateLimitError, 429, "rate_limit_exceeded"),
        (GatewayError("upstream_timeout", "vLLM took too long"), openai.InternalServerError, 504, "timeout"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_errors_map_to_sdk_exceptions(error, exc, status, code, stream):
    with pytest.raises(exc) as caught:
        FakeGateway(error=error).client().responses.create(model="m", input="x", stream=stream)
    assert caught.value.status_code == status
    assert caught.value.code == code and caught.value.body["message"] == error.message


def test_invalid_request_reaches_sdk_as_bad_request():
    with pytest.raises(openai.BadRequestError) as caught:
        FakeGateway().client().responses.create(model="m", input=[{"type": "message", "role": "robot", "content": "x"}])
    assert caught.value.type == "invalid_request_error" and caught.value.param == "input[0].role"


# --- history parsing -----------------------------------------------------------------------

PNG = "iVBORw0KGgo="


def test_codex_history_round_trip():
    """Turn 1 is answered by polar; turn 2 sends it back the way Codex does (no ids, blob-only reasoning)."""
    first = FakeGateway(
        result(content="I'll look.", reasoning=Reasoning(text="List the dir first."), tool_calls=TWO_CALLS[:1])
    )
    out = first.client().responses.create(
        model="m", input="What is here?", tools=[SHELL_TOOL], include=ENCRYPTED, store=False
    )
    reasoning, message, call = out.output

    gateway = FakeGateway()
    gateway.client().responses.create(
        model="m",
        instructions="You are Codex.",
        tools=[SHELL_TOOL],
        include=ENCRYPTED,
        store=False,
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is here?"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": reasoning.encrypted_content},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": message.content[0].text}],
            },
            {"type": "function_call", "name": call.name, "arguments": call.arguments, "call_id": call.call_id},
            {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt\nb.txt"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Two files."}], "content": None},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two files."}]},
            {"role": "user", "content": "Thanks"},
        ],
    )
    assert gateway.requests[0].messages == [
        Message(role="system", content=[TextPart(text="You are Codex.")]),
        Message(role="system", content=[TextPart(text="<permissions/>")]),
        Message(role="user", content=[TextPart(text="What is here?")]),
        Message(
            role="assistant",
            reasoning=[Reasoning(text="List the dir first.", signature=reasoning.encrypted_content)],
            content=[TextPart(text="I'll look.")],
            tool_calls=[TWO_CALLS[0]],
        ),
        Message(role="tool", tool_call_id="call_ls", name="shell", content=[TextPart(text="a.txt\nb.txt")]),
        Message(role="assistant", reasoning=[Reasoning(text="Two files.")], content=[TextPart(text="Two files.")]),
        Message(role="user", content=[TextPart(text="Thanks")]),
    ]


def test_parallel_calls_custom_tools_and_rich_outputs_merge_per_turn():
    gateway = FakeGateway()
    gateway.client().responses.create(
        model="m",
        tools=[SHELL_TOOL, PATCH_TOOL, {"type": "web_search"}, {"type": "local_shell"}],
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look:"},
                    {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
                ],
            },
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Two calls."}]},
            {"type": "function_call", "name": "shell", "arguments": TWO_CALLS[0].arguments, "call_id": "call_ls"},
            {"type": "function_call", "name": "shell", "arguments": TWO_CALLS[1].arguments, "call_id": "call_pwd"},
            {"type": "function_call_output", "call_id": "call_ls", "output": [{"type": "input_text", "text": "a.txt"}]},
            {"type": "function_call_output", "call_id": "call_pwd", "output": "/repo"},
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "x"},
            },
            {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": PATCH},
            {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"},
            {
                "type": "local_shell_call",
                "id": "lsh_1",
                "call_id": "call_sh",
                "status": "completed",
                "action": {"type": "exec", "command": ["ls"], "env": {}},
            },
            {"type": "local_shell_call_output", "id": "lsh_1", "output": "a.txt"},
        ],
    )
    request = gateway.requests[0]
    assert request.messages == [
        Message(role="user", content=[TextPart(text="Look:"), ImagePart(media_type="image/png", data=PNG)]),
        Message(role="assistant", reasoning=[Reasoning(text="Two calls.")], tool_calls=TWO_CALLS),
        Message(role="tool", tool_call_id="call_ls", name="shell", content=[TextPart(text="a.txt")]),
        Message(role="tool", tool_call_id="call_pwd", name="shell", content=[TextPart(text="/repo")]),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="call_p", name="apply_patch", arguments=json.dumps({"input": PATCH}))],
        ),
        Message(role="tool", tool_call_id="call_p", name="apply_patch", content=[TextPart(text="Done!")]),
        Message(
            role="assistant",
            tool_calls=[
                ToolCall(id="call_sh", name="local_shell", arguments='{"type": "exec", "command": ["ls"], "env": {}}')
            ],
        ),
        Message(role="tool", tool_call_id="call_sh", name="local_shell", content=[TextPart(text="a.txt")]),
    ]
    assert [t.name for t in request.tools] == ["shell", "apply_patch"]
    assert gateway.parsed[0].rewrites == [
        "hosted tool not offered to the model: web_search",
        "hosted tool not offered to the model: local_shell",
        "input item skipped: web_search_call",
    ]


def test_reasoning_sources():
    def parse_reasoning(item: dict) -> list[Reasoning]:
        request = parse({"model": "m", "input": [{"type": "reasoning", **item}]})
        return request.messages[0].reasoning

    sealed = seal("inner thoughts")
    assert parse_reasoning({"summary": [{"type": "summary_text", "text": "short"}], "encrypted_content": sealed}) == [
        Reasoning(text="inner thoughts", signature=sealed)
    ]
    both = {"summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}]}
    assert parse_reasoning(both) == [Reasoning(text="a\n\nb")]
    assert parse_reasoning({"summary": [], "encrypted_content": "gAAAA-openai-blob"}) == [
        Reasoning(text="gAAAA-openai-blob", redacted=True)
    ]
    assert parse({"model": "m", "input": [{"type": "reasoning", "summary": []}]}).messages == []


def test_assistant_text_after_calls_starts_a_new_message():
    items = [
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "late"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "again"}]},
    ]
    messages = parse({"model": "m", "input": items}).messages
    assert [(m.role, m.text(), m.reasoning_text(), len(m.tool_calls)) for m in messages] == [
        ("assistant", "", "", 1),
        ("assistant", "late", "", 0),
        ("assistant", "", "again", 0),
    ]


def test_settings_reach_the_request_and_schema():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    request = parse(
        {
            "model": "m",
            "previous_response_id": "resp_abc",
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
            "reasoning": {"effort": "none"},
            "stream": True,
        },
    )
    assert request.continues == "resp_abc"
    assert request.messages == []  # history comes from the capture store
    assert request.response_schema == schema
    assert (request.thinking.enabled, request.thinking.effort) == (False, "none")
    assert request.stream is True


def _body(**fields) -> dict:
    return {"model": "m", "input": "x", **fields}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("hello", "request body"),
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        (_body(input=5), "input"),
        (_body(input=["x"]), "input[0]"),
        (_body(input=[{"type": 3}]), "input[0].type"),
        (
            _body(input=[{"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
            "input[0].content[0].type",
        ),
        (
            _body(input=[{"type": "message", "role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]),
            "input[0].content[0].image_url",
        ),
        (_body(input=[{"type": "function_call", "name": "f", "call_id": "c"}]), "input[0].arguments"),
        (_body(input=[{"type": "function_call_output", "call_id": "c"}]), "input[0].output"),
        (_body(input=[{"type": "reasoning", "summary": "nope"}]), "input[0].summary"),
        (_body(input=[{"type": "item_reference", "id": "msg_1"}]), "input[0]"),
        (_body(conversation="conv_1"), "conversation"),
        (_body(background=True), "background"),
        (_body(tools=[{"type": "function"}]), "tools[0].name"),
        (_body(tools=[{"name": "f"}]), "tools[0].type"),
        (_body(tool_choice="always"), "tool_choice"),
        (_body(text={"format": {"type": "json_schema"}}), "text.format.schema"),
        (_body(reasoning={"effort": 1}), "reasoning.effort"),
        (_body(include=[1]), "include[0]"),
        (_body(temperature=10**400), "temperature"),
        (_body(max_output_tokens="many"), "max_output_tokens"),
    ],
)
def test_invalid_requests_name_the_field(body, field):
    with pytest.raises(GatewayError) as caught:
        parse(body)
    assert caught.value.kind == "invalid_request"
    assert field in caught.value.message


JSON = json_values()
ITEM_TYPES = st.sampled_from(
    [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "web_search_call",
    ]
)
ITEM = st.fixed_dictionaries(
    {"type": ITEM_TYPES},
    optional={
        k: JSON
        for k in (
            "role",
            "content",
            "summary",
            "encrypted_content",
            "call_id",
            "name",
            "arguments",
            "output",
            "input",
            "action",
            "id",
        )
    },
)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        JSON,
        st.fixed_dictionaries(
            {"model": st.text(), "input": st.lists(ITEM, max_size=4) | JSON},
            optional={
                k: JSON for k in ("instructions", "tools", "tool_choice", "text", "reasoning", "include", "temperature")
            },
        ),
    )
)
def test_any_body_parses_or_fails_cleanly(body):
    try:
        assert isinstance(parse(body), ChatRequest)
    except GatewayError as error:
        assert error.kind == "invalid_request" and error.message
