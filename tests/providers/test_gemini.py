"""The Gemini provider against the real google-genai SDK, with no network.

The SDK keeps its own request building, serialisation, SSE parsing and error mapping; only its
httpx transport is swapped for `httpx.MockTransport`, whose handler runs polar's
match → parse → render exactly as the gateway does, answering with a fixed `ChatResult`
(the stand-in for the upstream model). Raw-JSON tests cover what the SDK does not send:
Gemini CLI's Code Assist envelope, id-less function calls, hand-written histories.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass, field

import httpx
import pytest
from google import genai
from google.genai import errors, types
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.canonical import (
    ChatRequest,
    ChatResult,
    ImagePart,
    Reasoning,
    TextPart,
    ToolCall,
    Usage,
)
from polar.errors import GatewayError
from polar.providers.gemini import GeminiContext, GeminiGenerate
from polar.providers.gemini.parse import CodeAssist
from tests.providers.support import PROVIDERS, SEALER
from tests.support.fuzz import json_values

provider: GeminiGenerate = PROVIDERS.by_name["gemini"]
seal = SEALER.seal
MODEL = "gemini-2.5-flash"

TEXT = ChatResult(
    id="0a1b2c",
    model="qwen-tiny",
    created=0,
    content="Hello from polar — ünïcode ✓. " * 6,
    usage=Usage(prompt_tokens=12, completion_tokens=40, cached_tokens=4),
)
CALL = ChatResult(
    id="0a1b2d",
    model="qwen-tiny",
    created=0,
    tool_calls=[ToolCall(id="call_r1", name="read_file", arguments='{"path": "a.py"}')],
    finish_reason="tool_calls",
    usage=Usage(prompt_tokens=20, completion_tokens=9),
)
PARALLEL = ChatResult(
    id="0a1b2e",
    model="qwen-tiny",
    created=0,
    content="Checking both.",
    tool_calls=[
        ToolCall(id="call_p1", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="call_p2", name="get_weather", arguments='{"city": "東京"}'),
    ],
    finish_reason="tool_calls",
    usage=Usage(prompt_tokens=20, completion_tokens=25),
)
REASONING = "The user asks for the answer. I should think it through step by step before replying. " * 2
THOUGHT = ChatResult(
    id="0a1b2f",
    model="qwen-tiny",
    created=0,
    content="42",
    reasoning=Reasoning(text=REASONING),
    usage=Usage(prompt_tokens=10, completion_tokens=50, reasoning_tokens=45),
)
WEATHER = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="get_weather",
            description="Current weather in a city",
            parameters=types.Schema(
                type="OBJECT", properties={"city": types.Schema(type="STRING")}, required=["city"]
            ),
        )
    ]
)


@dataclass
class Backend:
    """Runs polar's Gemini provider for each SDK request; a fixed result stands in for vLLM."""

    result: ChatResult = field(default_factory=lambda: TEXT)
    error: GatewayError | None = None
    requests: list[ChatRequest] = field(default_factory=list)
    bodies: list[dict] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, _, _ = request.url.raw_path.decode().partition("?")
        route = provider.match(request.method, path, dict(request.url.params), dict(request.headers))
        try:
            if request.method == "GET" and path.endswith("/models"):
                reply = provider.render_models(["qwen-tiny", "qwen-coder"])
            elif route is None:
                raise GatewayError("not_found", f"no route for {request.method} {path}")
            else:
                self.bodies.append(json.loads(request.content))
                parsed = provider.parse(route, self.bodies[-1])
                self.requests.append(parsed.request)
                if self.error is not None:
                    raise self.error
                if route.endpoint == "count_tokens":
                    reply = provider.render_count(route, 7)
                else:
                    reply = provider.render(route, parsed.context, parsed.request, self.result)
        except GatewayError as exc:
            reply = provider.render_error(exc)
        return httpx.Response(reply.status, content=reply.body, headers=reply.headers)


@pytest.fixture
def backend() -> Backend:
    return Backend()


@pytest.fixture
def client(backend: Backend) -> genai.Client:
    transport = httpx.MockTransport(backend)
    options = types.HttpOptions(
        base_url="http://polar.test",
        httpx_client=httpx.Client(transport=transport),
        httpx_async_client=httpx.AsyncClient(transport=transport),
    )
    return genai.Client(api_key="k", http_options=options)


def generate(client: genai.Client, stream: bool, **kwargs) -> list[types.GenerateContentResponse]:
    """The SDK's answer as a list of responses (one when not streamed)."""
    kwargs = {"model": MODEL, "contents": "hi", **kwargs}
    if stream:
        return list(client.models.generate_content_stream(**kwargs))
    return [client.models.generate_content(**kwargs)]


def all_parts(responses: list[types.GenerateContentResponse]) -> list[types.Part]:
    return [p for r in responses for p in (r.candidates[0].content.parts or [])]


def unb64(signature: bytes | str) -> str:
    return signature.decode() if isinstance(signature, bytes) else base64.b64decode(signature).decode()


# ---- the SDK, end to end -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_text(client, backend, stream):
    responses = generate(client, stream, config=types.GenerateContentConfig(temperature=0.2, max_output_tokens=64))
    assert "".join(r.text for r in responses) == TEXT.content
    final = responses[-1]
    assert final.candidates[0].finish_reason == types.FinishReason.STOP
    assert final.model_version == MODEL and final.response_id == TEXT.id
    usage = final.usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count, usage.total_token_count) == (12, 40, 52)
    assert usage.cached_content_token_count == 4 and usage.thoughts_token_count is None
    if stream:
        assert len(responses) > 1
        assert all(r.candidates[0].finish_reason is None for r in responses[:-1])
        totals = [r.usage_metadata.total_token_count for r in responses]
        assert totals == sorted(totals)  # cumulative
    (request,) = backend.requests
    assert request.model == MODEL and request.stream is stream
    assert [(m.role, m.text()) for m in request.messages] == [("user", "hi")]
    assert (request.sampling.temperature, request.sampling.max_tokens) == (0.2, 64)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_function_call(client, backend, stream):
    backend.result = CALL
    responses = generate(client, stream, config=types.GenerateContentConfig(tools=[WEATHER]))
    calls = [p.function_call for p in all_parts(responses) if p.function_call]
    assert [(c.id, c.name, c.args) for c in calls] == [("call_r1", "read_file", {"path": "a.py"})]
    assert responses[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert all(p.thought_signature is None for p in all_parts(responses))  # no reasoning, no signature
    (request,) = backend.requests
    assert request.tools[0].name == "get_weather"
    assert request.tools[0].parameters == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_parallel_function_calls(client, backend, stream):
    backend.result = PARALLEL
    responses = generate(client, stream, config=types.GenerateContentConfig(tools=[WEATHER]))
    parts = all_parts(responses)
    assert "".join(p.text for p in parts if p.text) == "Checking both."
    calls = [(p.function_call.id, p.function_call.args) for p in parts if p.function_call]
    assert calls == [("call_p1", {"city": "Paris"}), ("call_p2", {"city": "東京"})]
    if stream:  # each call travels whole, in a chunk of its own as soon as it is complete; the last has the finish
        chunks_with_calls = [[p.function_call.id for p in r.candidates[0].content.parts if p.function_call]
                             for r in responses if any(p.function_call for p in r.candidates[0].content.parts or [])]
        assert chunks_with_calls == [["call_p1"], ["call_p2"]]
        last = responses[-1].candidates[0]
        assert [p.function_call.id for p in last.content.parts] == ["call_p2"]
        assert last.finish_reason == types.FinishReason.STOP


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_thoughts_and_text(client, backend, stream):
    backend.result = THOUGHT
    thinking = types.ThinkingConfig(include_thoughts=True, thinking_budget=512)
    config = types.GenerateContentConfig(thinking_config=thinking)
    responses = generate(client, stream, config=config)
    parts = all_parts(responses)
    assert "".join(p.text for p in parts if p.thought) == REASONING
    assert "".join(p.text for p in parts if p.text and not p.thought) == "42"
    assert parts[0].thought  # thoughts come first
    signed = [p for p in parts if p.thought_signature]
    assert len(signed) == 1 and signed[0].text == "42" and not signed[0].thought
    assert unb64(signed[0].thought_signature) == seal(REASONING)
    usage = responses[-1].usage_metadata
    assert (usage.thoughts_token_count, usage.candidates_token_count, usage.total_token_count) == (45, 5, 60)
    thinking = backend.requests[0].thinking
    assert (thinking.enabled, thinking.budget_tokens) == (True, 512)  # the SDK sends thinking_config snake_case


def test_thoughts_hidden_unless_included(client, backend):
    backend.result = THOUGHT
    (response,) = generate(client, False)
    parts = response.candidates[0].content.parts
    assert [p.text for p in parts] == ["42"] and not parts[0].thought
    assert unb64(parts[0].thought_signature) == seal(REASONING)  # the reasoning still travels, sealed


def test_history_echo_recovers_reasoning(client, backend):
    """The SDK sends the model turn back as it got it; polar reads its own signature."""
    backend.result = THOUGHT
    config = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
    (first,) = generate(client, False, config=config)
    model_turn = first.candidates[0].content
    without_thoughts = types.Content(role="model", parts=[p for p in model_turn.parts if not p.thought])
    for turn in (model_turn, without_thoughts):  # Gemini CLI keeps only the non-thought parts
        generate(client, False, contents=[types.Content(role="user", parts=[types.Part(text="q")]), turn, "next"])
        assistant = backend.requests[-1].messages[1]
        assert assistant.role == "assistant" and assistant.text() == "42"
        assert assistant.reasoning_text() == REASONING
        assert assistant.reasoning[0].signature == base64.b64encode(seal(REASONING).encode()).decode()


def test_async_stream(client, backend):
    backend.result = PARALLEL

    async def run() -> list[types.GenerateContentResponse]:
        stream = await client.aio.models.generate_content_stream(model=MODEL, contents="hi")
        return [chunk async for chunk in stream]

    responses = asyncio.run(run())
    parts = all_parts(responses)
    assert [p.function_call.args["city"] for p in parts if p.function_call] == ["Paris", "東京"]
    assert responses[-1].candidates[0].finish_reason == types.FinishReason.STOP


def test_count_tokens(client, backend):
    response = client.models.count_tokens(model=MODEL, contents=["one", "two"])
    assert response.total_tokens == 7
    (request,) = backend.requests
    assert request.model == MODEL and not request.stream
    (user,) = request.messages  # the SDK puts both strings in one user turn
    assert user.content == [TextPart(text="one"), TextPart(text="two")]


def test_list_models(client):
    models = list(client.models.list())
    assert [(m.name, m.display_name) for m in models] == [
        ("models/qwen-tiny", "qwen-tiny"),
        ("models/qwen-coder", "qwen-coder"),
    ]
    assert models[0].supported_actions == ["generateContent", "countTokens"]


@pytest.mark.parametrize(
    ("kind", "exc", "code", "status"),
    [
        ("invalid_request", errors.ClientError, 400, "INVALID_ARGUMENT"),
        ("authentication", errors.ClientError, 401, "UNAUTHENTICATED"),
        ("not_found", errors.ClientError, 404, "NOT_FOUND"),
        ("rate_limit", errors.ClientError, 429, "RESOURCE_EXHAUSTED"),
        ("internal", errors.ServerError, 500, "INTERNAL"),
        ("upstream_unavailable", errors.ServerError, 503, "UNAVAILABLE"),
        ("upstream_timeout", errors.ServerError, 504, "DEADLINE_EXCEEDED"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_errors(client, backend, kind, exc, code, status, stream):
    backend.error = GatewayError(kind, "it went wrong")
    with pytest.raises(exc) as info:
        generate(client, stream)
    assert (info.value.code, info.value.status, info.value.message) == (code, status, "it went wrong")


def test_context_length_error(client, backend):
    backend.error = GatewayError("context_length", "prompt is 40000 tokens, the model allows 32768")
    with pytest.raises(errors.ClientError) as info:
        generate(client, False)
    assert (info.value.code, info.value.status) == (400, "INVALID_ARGUMENT")
    assert "input token count exceeds the maximum" in info.value.message
    assert "40000" in info.value.message


def test_parse_error_reaches_sdk(client, backend):
    with pytest.raises(errors.ClientError) as info:
        generate(client, False, config=types.GenerateContentConfig(candidate_count=2))
    assert info.value.code == 400 and "candidateCount" in info.value.message
    violation = info.value.details["error"]["details"][0]["fieldViolations"][0]
    assert violation["field"] == "generationConfig.candidateCount"


def test_unknown_path_is_not_found(client):
    with pytest.raises(errors.ClientError) as info:
        client.models.embed_content(model=MODEL, contents="hi")
    assert info.value.code == 404


# ---- routing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "endpoint", "model", "stream"),
    [
        ("/v1beta/models/gemini-2.5-pro:generateContent", "generate", "gemini-2.5-pro", False),
        ("/v1/models/gemini-2.5-pro:streamGenerateContent", "generate", "gemini-2.5-pro", True),
        ("/v1alpha/models/gemini-2.5-pro:countTokens", "count_tokens", "gemini-2.5-pro", False),
        ("/v1beta/models%2Fgemini-x%3AgenerateContent", "generate", "gemini-x", False),
        ("/v1beta/models/models/gemini-x:generateContent", "generate", "gemini-x", False),
        ("/v1beta/tunedModels/my-tune:generateContent", "generate", "tunedModels/my-tune", False),
        ("/v1internal:streamGenerateContent", "generate", None, True),
        ("/v1internal:countTokens", "count_tokens", None, False),
    ],
)
def test_match(path, endpoint, model, stream):
    route = provider.match("POST", path, {"alt": "sse"}, {})
    assert (route.endpoint, route.model, route.stream, route.query) == (endpoint, model, stream, {"alt": "sse"})
    assert route.code_assist == path.startswith("/v1internal")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1beta/models/gemini-2.5-pro:generateContent"),
        ("POST", "/v1beta/models/gemini-2.5-pro:embedContent"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1internal:loadCodeAssist"),
        ("POST", "/v2/models/x:generateContent"),
    ],
)
def test_no_match(method, path):
    assert provider.match(method, path, {}, {}) is None


def test_stream_without_alt_sse_is_a_json_array():
    route = provider.match("POST", "/v1beta/models/m:streamGenerateContent", {}, {})
    parsed = provider.parse(route, {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    reply = provider.render(route, parsed.context, parsed.request, PARALLEL)
    assert reply.headers["content-type"] == "application/json"
    chunks = json.loads(reply.body)
    assert [c["candidates"][0].get("finishReason") for c in chunks] == [None, None, "STOP"]  # text, call, call
    assert chunks[1]["candidates"][0]["content"]["parts"][0]["functionCall"]["name"] == "get_weather"


# ---- Gemini CLI ------------------------------------------------------------------------------


def sse_chunks(body: bytes) -> list[dict]:
    """Gemini CLI's own SSE reading (code_assist/server.ts): buffer `data: ` lines until a blank line."""
    chunks, buffered = [], []
    for line in body.decode().splitlines():
        if line.startswith("data: "):
            buffered.append(line[6:].strip())
        elif line == "" and buffered:
            chunks.append(json.loads("\n".join(buffered)))
            buffered = []
    assert not buffered, "stream ended inside an event"
    return chunks


def gemini_cli_check(chunks: list[dict]) -> None:
    """A double of Gemini CLI's end-of-stream validation (geminiChat.ts processStreamResponse).

    Raises ValueError with the CLI's error type where the CLI would throw InvalidStreamError.
    """
    finish, has_call, text = None, False, ""
    for chunk in chunks:
        candidate = chunk["candidates"][0]
        finish = candidate.get("finishReason") or finish
        parts = candidate["content"].get("parts") or []
        valid = parts and all(p and (p.get("thought") or p.get("text") != "") for p in parts)
        if valid:
            has_call = has_call or any("functionCall" in p for p in parts)
            text += "".join(p.get("text", "") for p in parts if not p.get("thought"))
    if not has_call:
        if not finish:
            raise ValueError("NO_FINISH_REASON")
        if not text.strip():
            raise ValueError("NO_RESPONSE_TEXT")


CODE_ASSIST_BODY = {
    "model": "gemini-2.5-pro",
    "project": "proj-123",
    "user_prompt_id": "prompt-9",
    "request": {
        "contents": [{"role": "user", "parts": [{"text": "list files"}]}],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are a CLI agent."}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "list_directory",
                        "description": "List a directory",
                        "parametersJsonSchema": {"type": "object", "properties": {"dir_path": {"type": "string"}}},
                    }
                ]
            }
        ],
        "generationConfig": {
            "temperature": 0,
            "topP": 1,
            "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192},
        },
        "session_id": "sess-1",
    },
}


@pytest.mark.parametrize("result", [TEXT, CALL, PARALLEL, THOUGHT], ids=["text", "call", "parallel", "thought"])
def test_code_assist_stream(result):
    route = provider.match("POST", "/v1internal:streamGenerateContent", {"alt": "sse"}, {})
    parsed = provider.parse(route, CODE_ASSIST_BODY)
    request = parsed.request
    assert request.model == "gemini-2.5-pro" and request.stream
    envelope = CodeAssist(project="proj-123", user_prompt_id="prompt-9", session_id="sess-1")
    assert parsed.context == GeminiContext(include_thoughts=True, code_assist=envelope)
    assert [(m.role, m.text()) for m in request.messages] == [
        ("system", "You are a CLI agent."),
        ("user", "list files"),
    ]
    assert request.tools[0].parameters == {"type": "object", "properties": {"dir_path": {"type": "string"}}}
    assert (request.thinking.enabled, request.thinking.budget_tokens) == (True, 8192)

    reply = provider.render(route, parsed.context, request, result)
    assert reply.headers["content-type"].startswith("text/event-stream")
    envelopes = sse_chunks(reply.body)
    assert all(set(e) == {"response", "traceId"} and e["traceId"] == result.id for e in envelopes)
    chunks = [e["response"] for e in envelopes]
    gemini_cli_check(chunks)
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert all("finishReason" not in c["candidates"][0] for c in chunks[:-1])


def test_code_assist_generate_and_count():
    route = provider.match("POST", "/v1internal:generateContent", {}, {})
    parsed = provider.parse(route, CODE_ASSIST_BODY)
    reply = provider.render(route, parsed.context, parsed.request, TEXT)
    body = json.loads(reply.body)
    assert body["traceId"] == TEXT.id
    assert body["response"]["candidates"][0]["content"] == {"role": "model", "parts": [{"text": TEXT.content}]}

    route = provider.match("POST", "/v1internal:countTokens", {}, {})
    contents = [{"role": "user", "parts": [{"text": "x"}]}]
    count_body = {"request": {"model": "models/gemini-2.5-flash", "contents": contents}}
    assert provider.parse(route, count_body).request.model == "gemini-2.5-flash"
    assert json.loads(provider.render_count(route, 3).body)["totalTokens"] == 3


def test_empty_answer_still_finishes():
    """An empty no-tool answer is not padded with text: the CLI will retry it, but the stream is well-formed."""
    route = provider.match("POST", "/v1beta/models/m:streamGenerateContent", {"alt": "sse"}, {})
    parsed = provider.parse(route, {"contents": [{"parts": [{"text": "hi"}]}]})
    empty = ChatResult(id="e", model="m", created=0, finish_reason="length", usage=Usage(prompt_tokens=3))
    (chunk,) = sse_chunks(provider.render(route, parsed.context, parsed.request, empty).body)
    assert chunk["candidates"][0] == {"content": {"role": "model"}, "finishReason": "MAX_TOKENS", "index": 0}
    with pytest.raises(ValueError, match="NO_RESPONSE_TEXT"):
        gemini_cli_check([chunk])


# ---- parsing histories ------------------------------------------------------------------------


def parse(body: dict, path: str = "/v1beta/models/m:generateContent") -> ChatRequest:
    return provider.parse(provider.match("POST", path, {}, {}), body).request


def test_history_with_ids():
    request = parse(
        {
            "contents": [
                {"role": "user", "parts": [{"text": "read a and b"}]},
                {
                    "role": "model",
                    "parts": [
                        {"text": "Reading."},
                        {"functionCall": {"id": "c1", "name": "read_file", "args": {"path": "a"}}},
                        {"functionCall": {"id": "c2", "name": "read_file", "args": {"path": "b"}}},
                    ],
                },
                {
                    "role": "user",
                    "parts": [
                        {"functionResponse": {"id": "c2", "name": "read_file", "response": {"output": "B"}}},
                        {"functionResponse": {"id": "c1", "name": "read_file", "response": {"error": "no such file"}}},
                        {"text": "and summarise"},
                    ],
                },
            ]
        }
    )
    _user, assistant, tool_b, tool_a, follow_up = request.messages
    assert assistant.text() == "Reading."
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assistant.tool_calls] == [
        ("c1", "read_file", {"path": "a"}),
        ("c2", "read_file", {"path": "b"}),
    ]
    assert (tool_b.role, tool_b.tool_call_id, tool_b.name) == ("tool", "c2", "read_file")
    assert (tool_b.text(), tool_b.is_error) == ("B", False)
    assert (tool_a.tool_call_id, tool_a.text(), tool_a.is_error) == ("c1", "no such file", True)
    assert (follow_up.role, follow_up.text()) == ("user", "and summarise")


def test_history_without_ids_pairs_by_name_and_order():
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "read_file", "args": {"path": "a"}}},
                    {"functionCall": {"name": "ls", "args": {}}},
                    {"functionCall": {"name": "read_file", "args": {"path": "b"}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "ls", "response": {"output": "a b"}}},
                    {"functionResponse": {"name": "read_file", "response": {"output": "A"}}},
                    # Gemini CLI invents ids for responses to id-less calls: they match no call.
                    {"functionResponse": {"id": "read_file-1700-x", "name": "read_file", "response": {"output": "B"}}},
                ],
            },
        ]
    }
    request = parse(body)
    calls = request.messages[1].tool_calls
    assert len({c.id for c in calls}) == 3 and all(c.id.startswith("call_") for c in calls)
    results = {m.text(): m.tool_call_id for m in request.messages[2:]}
    assert results == {"a b": calls[1].id, "A": calls[0].id, "B": calls[2].id}
    assert [c.id for c in parse(body).messages[1].tool_calls] == [c.id for c in calls]  # stable across requests


def test_parts_and_system_forms():
    request = parse(
        {
            "systemInstruction": "Be brief.",
            "contents": [
                {
                    "parts": [
                        {"text": "what is "},
                        {"text": "this?"},
                        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                        {"fileData": {"mimeType": "image/jpeg", "fileUri": "gs://b/cat.jpg"}},
                    ]
                },
                {
                    "role": "model",
                    "parts": [
                        {"text": "hidden", "thought": True, "thoughtSignature": "c2ln"},
                        {"text": "A "},
                        {"text": "cat."},
                    ],
                },
                {
                    "role": "user",
                    "parts": [
                        {
                            "functionResponse": {
                                "name": "screenshot",
                                "response": {"status": "ok", "size": 2},
                                "parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}],
                            }
                        }
                    ],
                },
            ],
        }
    )
    system, user, assistant, tool = request.messages
    assert (system.role, system.text()) == ("system", "Be brief.")
    assert user.content == [
        TextPart(text="what is "),
        TextPart(text="this?"),
        ImagePart(media_type="image/png", data="iVBORw0KGgo="),
        ImagePart(media_type="image/jpeg", url="gs://b/cat.jpg"),
    ]
    assert assistant.reasoning == [Reasoning(text="hidden", signature="c2ln")]
    assert assistant.content == [TextPart(text="A cat.")]  # a model turn's pieces are one answer
    assert tool.text() == '{"status":"ok","size":2}' and isinstance(tool.content[1], ImagePart)


def test_tools_schema_and_config():
    request = parse(
        {
            "contents": [{"role": "user", "parts": [{"text": "x"}]}],
            "tools": [
                {"googleSearch": {}},
                {
                    "functionDeclarations": [
                        {
                            "name": "edit",
                            "parameters": {
                                "type": "OBJECT",
                                "propertyOrdering": ["path", "lines"],
                                "properties": {
                                    "path": {"type": "STRING", "nullable": True},
                                    "lines": {"type": "ARRAY", "items": {"type": "INTEGER"}, "minItems": "1"},
                                    "mode": {"type": "STRING", "format": "enum", "enum": ["a", "b"]},
                                },
                                "required": ["path"],
                            },
                        },
                        {"name": "noop"},
                    ]
                },
                {"codeExecution": {}},
            ],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["edit"]}},
            "generationConfig": {
                "topK": 40,
                "seed": 7,
                "stopSequences": ["END"],
                "presencePenalty": 0.5,
                "responseMimeType": "application/json",
                "responseSchema": {"type": "OBJECT", "properties": {"ok": {"type": "BOOLEAN"}}},
                "thinkingConfig": {"thinkingLevel": "LOW"},
            },
        }
    )
    edit, noop = request.tools
    assert edit.parameters == {
        "type": "object",
        "properties": {
            "path": {"type": ["string", "null"]},
            "lines": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
            "mode": {"type": "string", "format": "enum", "enum": ["a", "b"]},
        },
        "required": ["path"],
    }
    assert noop.parameters == {"type": "object", "properties": {}}
    assert (request.tool_choice.mode, request.tool_choice.name) == ("tool", "edit")
    s = request.sampling
    assert (s.top_k, s.seed, s.stop, s.presence_penalty) == (40, 7, ["END"], 0.5)
    assert request.response_schema == {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    assert (request.thinking.enabled, request.thinking.effort) == (True, "low")


@pytest.mark.parametrize(
    ("config", "mode"),
    [({"mode": "NONE"}, "none"), ({"mode": "ANY"}, "required"), ({"mode": "VALIDATED"}, "auto"), ({}, "auto")],
)
def test_tool_choice_modes(config, mode):
    body = {"contents": [{"parts": [{"text": "x"}]}], "toolConfig": {"functionCallingConfig": config}}
    assert parse(body).tool_choice.mode == mode


def test_thinking_off_and_count_tokens_wrapper():
    body = {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}
    assert parse(body).thinking.enabled is False
    wrapped = {"generateContentRequest": {"model": "models/other", **body}}
    request = parse(wrapped, "/v1beta/models/m:countTokens")
    assert request.model == "m" and request.messages[0].text() == "x"


# ---- invalid bodies ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "request body"),
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": {"parts": []}}, "contents"),
        ({"contents": ["hi"]}, "contents[0]"),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ({"contents": [{"parts": [{"text": 3}]}]}, "contents[0].parts[0].text"),
        ({"contents": [{"parts": [{}]}]}, "contents[0].parts[0]"),
        ({"contents": [{"parts": [{"functionCall": {"name": "f"}}]}]}, "contents[0].parts[0].functionCall"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}, "functionCall.name"),
        (
            {"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": "x"}}]}]},
            "functionCall.args",
        ),
        ({"contents": [{"parts": [{"inlineData": {"mimeType": "application/pdf", "data": "x"}}]}]}, "inlineData"),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"topK": 1.5}}, "generationConfig.topK"),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"stopSequences": [1]}}, "stopSequences"),
        ({"contents": [{"parts": [{"text": "x"}]}], "tools": [{"functionDeclarations": [{"name": 1}]}]}, "name"),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}},
            "toolConfig.functionCallingConfig.mode",
        ),
        ({"contents": [{"parts": [{"text": "x"}]}], "systemInstruction": 5}, "systemInstruction"),
    ],
)
def test_invalid_bodies(body, field):
    with pytest.raises(GatewayError) as info:
        parse(body)
    assert info.value.kind == "invalid_request"
    assert field in info.value.message


def test_code_assist_body_needs_request_and_model():
    route = provider.match("POST", "/v1internal:generateContent", {}, {})
    no_model = {"request": {"contents": [{"parts": [{"text": "x"}]}]}}
    for body, named in [({"model": "m"}, "request"), (no_model, "model")]:
        with pytest.raises(GatewayError, match=named):
            provider.parse(route, body)


JSON = json_values(text=5, nan=True)
part_keys = st.sampled_from(["text", "thought", "thoughtSignature", "functionCall", "functionResponse", "inlineData"])
parts = st.lists(st.dictionaries(part_keys, JSON, max_size=3), max_size=3)
contents = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "model", 1]), "parts": parts}), max_size=3)
bodies = st.fixed_dictionaries(
    {"contents": contents | JSON},
    optional={key: JSON for key in ("tools", "generationConfig", "toolConfig", "systemInstruction")},
)


@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_parse_never_crashes(body):
    """Any JSON either parses or is refused as invalid_request — no Python exception escapes."""
    try:
        parse(body)
    except GatewayError as exc:
        assert exc.kind == "invalid_request"
