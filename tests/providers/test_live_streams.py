"""Live streams: each provider's renderer fed delta by delta, read back by the official SDKs.

The upstream streams a turn piece by piece (token-sized text, tool calls as pieces or whole, silences
filled with keep-alives); the SDK's own stream accumulator must end with the same message the JSON
answer gives for the finished result. Handlers here stand in for the gateway (no network): they build
the renderer polar builds and play a script of renderer calls into the response body.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import anthropic
import httpx
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from polar.canonical import ChatResult, Delta, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta, Usage
from polar.errors import GatewayError
from polar.providers.base import Provider, Route
from tests.providers.support import PROVIDERS, SEALER

CALL_ID = "5eed0a11"
THOUGHT = "The user wants Paris weather; call the tool.\n\nThen report it — ünïcode ✓."
TEXT = "Let me check the weather in Paris for you."
PARIS = ToolCall(id="call_p", name="get_weather", arguments='{"city": "Paris", "unit": "C"}')
TOKYO = ToolCall(id="call_t", name="get_weather", arguments='{"city":"東京"}')


def result(content: str = "", reasoning: str | None = None, calls: tuple[ToolCall, ...] = (),
           finish: str = "stop") -> ChatResult:
    from polar.canonical import Reasoning

    return ChatResult(id=CALL_ID, model="qwen", created=1_700_000_000, content=content,
                      reasoning=Reasoning(text=reasoning) if reasoning else None, tool_calls=list(calls),
                      finish_reason=finish, usage=Usage(prompt_tokens=31, completion_tokens=57))


def tokens(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def token_faithful(final: ChatResult) -> list:
    """What the token-faithful upstream streams: text token by token, each call whole once parsed."""
    steps: list = ["keepalive", ("open", final.usage.prompt_tokens)]
    steps += [ReasoningDelta(t) for t in tokens(final.reasoning.text)] if final.reasoning else []
    steps.append("keepalive")  # a silence mid-stream
    steps += [TextDelta(t) for t in tokens(final.content)]
    steps += [ToolCallDelta(i, c.arguments, id=c.id, name=c.name, complete=True) for i, c in enumerate(final.tool_calls)]
    return steps


def chat_pieces(final: ChatResult) -> list:
    """What vLLM's chat endpoint streams: the prompt size with the first chunk, calls as pieces."""
    steps: list = ["keepalive", "keepalive"]
    deltas: list[Delta] = [ReasoningDelta(t) for t in tokens(final.reasoning.text)] if final.reasoning else []
    deltas += [TextDelta(t) for t in tokens(final.content)]
    for i, c in enumerate(final.tool_calls):
        deltas.append(ToolCallDelta(i, "", id=c.id, name=c.name))
        deltas += [ToolCallDelta(i, piece) for piece in tokens(c.arguments, 4)]
    steps.append(("open", final.usage.prompt_tokens))
    return steps + deltas


def play(provider: Provider, route: Route, body: dict, steps: list, final: ChatResult | GatewayError) -> bytes:
    parsed = provider.parse(route, body)
    renderer = provider.stream_renderer(route, parsed.context, parsed.request, CALL_ID)
    out = renderer.opening(None)
    for step in steps:
        if step == "keepalive":
            out += renderer.keepalive()
        elif isinstance(step, tuple):
            out += renderer.opening(step[1])
        else:
            out += renderer.delta(step)
    if isinstance(final, GatewayError):
        return out + renderer.error(final, provider.statuses[final.kind])
    return out + renderer.finish(final)


@dataclass
class Scripted:
    """A stand-in for the gateway: live stream for `stream: true`, the JSON answer otherwise."""

    provider: Provider
    steps: list
    final: ChatResult | GatewayError

    def reply(self, method: str, path: str, query: dict, content: bytes) -> tuple[int, dict, bytes]:
        route = self.provider.match(method, path, query, {})
        body = json.loads(content)
        if route.stream or body.get("stream"):
            data = play(self.provider, route, body, self.steps, self.final)
            renderer = self.provider.stream_renderer(route, self.provider.parse(route, body).context,
                                                     self.provider.parse(route, body).request, CALL_ID)
            return 200, {"content-type": renderer.content_type}, data
        parsed = self.provider.parse(route, body)
        reply = self.provider.render(route, parsed.context, parsed.request, self.final)
        return reply.status, reply.headers, reply.body

    def httpx_handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode().split("?")[0]
        status, headers, body = self.reply(request.method, path, dict(request.url.params), request.content)
        return httpx.Response(status, headers=headers, content=body)

    def httpx2_handler(self, request: httpx2.Request) -> httpx2.Response:
        status, headers, body = self.reply(request.method, request.url.path, dict(request.url.params), request.content)
        return httpx2.Response(status, headers=headers, content=body)


FINALS = {
    "thinking_text_call": result(TEXT, THOUGHT, (PARIS,), "tool_calls"),
    "text_only": result(TEXT * 3),
    "parallel_calls": result("", None, (PARIS, TOKYO), "tool_calls"),
    "truncated_text": result(TEXT, THOUGHT, finish="length"),
}
UPSTREAMS: dict[str, Callable[[ChatResult], list]] = {"token_faithful": token_faithful, "chat_pieces": chat_pieces}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}


def cases():
    return [pytest.param(name, up, id=f"{name}-{up}") for name in FINALS for up in UPSTREAMS]


# -- Anthropic -----------------------------------------------------------------------------------


def anthropic_client(scripted: Scripted) -> anthropic.Anthropic:
    transport = httpx2.MockTransport(scripted.httpx2_handler)
    return anthropic.Anthropic(api_key="k", base_url="http://polar.test", max_retries=0,
                               http_client=httpx2.Client(transport=transport))


ANTHROPIC_KW = {"model": "claude-test", "max_tokens": 512, "messages": [{"role": "user", "content": "weather?"}],
                "tools": [{"name": "get_weather", "input_schema": WEATHER}]}


@pytest.mark.parametrize(("name", "upstream"), cases())
def test_anthropic_live_stream_accumulates_the_json_answer(name: str, upstream: str) -> None:
    final = FINALS[name]
    client = anthropic_client(Scripted(PROVIDERS.by_name["anthropic"], UPSTREAMS[upstream](final), final))
    with client.messages.stream(**ANTHROPIC_KW) as stream:
        streamed = stream.get_final_message()
    plain = client.messages.create(**ANTHROPIC_KW)
    assert streamed.model_dump() == plain.model_dump()


def test_anthropic_error_mid_stream_raises_in_the_sdk() -> None:
    final = GatewayError("upstream_error", "the upstream broke off after 3 tokens")
    steps = token_faithful(FINALS["text_only"])[:8]
    client = anthropic_client(Scripted(PROVIDERS.by_name["anthropic"], steps, final))
    with pytest.raises(anthropic.APIStatusError, match="broke off"):
        with client.messages.stream(**ANTHROPIC_KW) as stream:
            stream.get_final_message()


def test_anthropic_omitted_thinking_streams_only_the_sealed_signature() -> None:
    final = FINALS["thinking_text_call"]
    scripted = Scripted(PROVIDERS.by_name["anthropic"], token_faithful(final), final)
    kwargs = {**ANTHROPIC_KW, "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}}
    with anthropic_client(scripted).messages.stream(**kwargs) as stream:
        events = list(stream)
        message = stream.get_final_message()
    assert not [e for e in events if e.type == "thinking"]
    thinking = message.content[0]
    assert thinking.thinking == "" and SEALER.unseal(thinking.signature) == THOUGHT


# -- OpenAI Chat ---------------------------------------------------------------------------------


def openai_client(scripted: Scripted) -> openai.OpenAI:
    transport = httpx.MockTransport(scripted.httpx_handler)
    return openai.OpenAI(api_key="k", base_url="http://polar.test/v1", max_retries=0,
                         http_client=httpx.Client(transport=transport))


CHAT_KW = {"model": "gpt-test", "messages": [{"role": "user", "content": "weather?"}],
           "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]}


@pytest.mark.parametrize(("name", "upstream"), cases())
def test_chat_live_stream_accumulates_the_json_answer(name: str, upstream: str) -> None:
    final = FINALS[name]
    client = openai_client(Scripted(PROVIDERS.by_name["openai_chat"], UPSTREAMS[upstream](final), final))
    with client.chat.completions.stream(**CHAT_KW, stream_options={"include_usage": True}) as stream:
        chunks = list(stream)
        streamed = stream.current_completion_snapshot  # (get_final_completion refuses a length cut)
    plain = client.chat.completions.create(**CHAT_KW)
    got, want = streamed.choices[0], plain.choices[0]
    assert got.finish_reason == want.finish_reason
    assert (got.message.content or None) == want.message.content  # the role chunk opens content with ""
    reasoning = "".join(c.chunk.choices[0].delta.model_extra.get("reasoning_content", "") for c in chunks
                        if c.type == "chunk" and c.chunk.choices)
    assert reasoning == (want.message.model_extra.get("reasoning_content") or "")
    calls = [(c.id, c.function.name, c.function.arguments) for c in got.message.tool_calls or []]
    assert calls == [(c.id, c.function.name, c.function.arguments) for c in want.message.tool_calls or []]
    assert streamed.usage.model_dump() == plain.usage.model_dump()


def test_chat_error_mid_stream_raises_in_the_sdk() -> None:
    final = GatewayError("upstream_error", "the upstream broke off after 3 tokens")
    client = openai_client(Scripted(PROVIDERS.by_name["openai_chat"], token_faithful(FINALS["text_only"])[:8], final))
    with pytest.raises(openai.APIError, match="broke off"):
        list(client.chat.completions.create(**CHAT_KW, stream=True))


# -- OpenAI Responses ----------------------------------------------------------------------------

RESPONSES_KW = {"model": "gpt-test", "input": "weather?", "include": ["reasoning.encrypted_content"],
                "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False}]}


@pytest.mark.parametrize(("name", "upstream"), cases())
def test_responses_live_stream_accumulates_the_json_answer(name: str, upstream: str) -> None:
    final = FINALS[name]
    client = openai_client(Scripted(PROVIDERS.by_name["openai_responses"], UPSTREAMS[upstream](final), final))
    with client.responses.stream(**RESPONSES_KW) as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    plain = client.responses.create(**RESPONSES_KW)
    def dump(items):  # (the stream helper's parsed items add `parsed: None`)
        return [i.model_dump(exclude_none=True) for i in items]

    assert dump(streamed.output) == dump(plain.output)
    assert streamed.status == plain.status and streamed.usage == plain.usage
    # What Codex builds its history from: one output_item.done per item, in order, equal to the answer's items.
    assert dump(e.item for e in events if e.type == "response.output_item.done") == dump(plain.output)
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


def test_responses_custom_tool_call_goes_out_whole() -> None:
    patch = ToolCall(id="call_ap", name="apply_patch", arguments=json.dumps({"input": "*** Begin Patch\n*** End Patch"}))
    final = result("", None, (patch,), "tool_calls")
    kwargs = {**RESPONSES_KW, "tools": [{"type": "custom", "name": "apply_patch", "description": "patch"}]}
    client = openai_client(Scripted(PROVIDERS.by_name["openai_responses"], chat_pieces(final), final))
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    assert streamed.output[0].type == "custom_tool_call" and streamed.output[0].input == "*** Begin Patch\n*** End Patch"
    deltas = [e for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert len(deltas) == 1 and deltas[0].delta == streamed.output[0].input


def test_responses_error_mid_stream_is_response_failed() -> None:
    final = GatewayError("upstream_error", "the upstream broke off after 3 tokens")
    client = openai_client(Scripted(PROVIDERS.by_name["openai_responses"], token_faithful(FINALS["text_only"])[:8], final))
    events = list(client.responses.create(**RESPONSES_KW, stream=True))
    assert events[-1].type == "response.failed"
    assert "broke off" in events[-1].response.error.message


def test_responses_keepalive_is_an_in_progress_event() -> None:
    final = FINALS["text_only"]
    client = openai_client(Scripted(PROVIDERS.by_name["openai_responses"], ["keepalive"] * 3 + token_faithful(final), final))
    events = list(client.responses.create(**RESPONSES_KW, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds.count("response.in_progress") == 6


# -- Gemini --------------------------------------------------------------------------------------


def gemini_client(scripted: Scripted) -> genai.Client:
    transport = httpx.MockTransport(scripted.httpx_handler)
    options = genai_types.HttpOptions(base_url="http://polar.test", httpx_client=httpx.Client(transport=transport))
    return genai.Client(api_key="k", http_options=options)


GEMINI_KW = {
    "model": "gemini-test", "contents": "weather?",
    "config": genai_types.GenerateContentConfig(
        tools=[genai_types.Tool(function_declarations=[genai_types.FunctionDeclaration(
            name="get_weather", parameters_json_schema=WEATHER)])],
        thinking_config=genai_types.ThinkingConfig(include_thoughts=True)),
}


@pytest.mark.parametrize(("name", "upstream"), cases())
def test_gemini_live_stream_carries_the_json_answer(name: str, upstream: str) -> None:
    final = FINALS[name]
    client = gemini_client(Scripted(PROVIDERS.by_name["gemini"], UPSTREAMS[upstream](final), final))
    chunks = list(client.models.generate_content_stream(**GEMINI_KW))
    plain = client.models.generate_content(**GEMINI_KW)
    parts = [p for c in chunks for p in c.candidates[0].content.parts or []]
    want = plain.candidates[0].content.parts or []

    def text(ps, thought):
        return "".join(p.text or "" for p in ps if bool(p.thought) == thought)

    assert text(parts, True) == text(want, True) and text(parts, False) == text(want, False)
    calls = [(p.function_call.id, p.function_call.name, p.function_call.args) for p in parts if p.function_call]
    assert calls == [(p.function_call.id, p.function_call.name, p.function_call.args) for p in want if p.function_call]
    signed = [p for p in parts if p.thought_signature]
    assert [s.thought_signature for s in signed] == [p.thought_signature for p in want if p.thought_signature]
    assert [c.candidates[0].finish_reason for c in chunks][:-1] == [None] * (len(chunks) - 1)
    assert chunks[-1].candidates[0].finish_reason == plain.candidates[0].finish_reason
    assert chunks[-1].usage_metadata == plain.usage_metadata


def test_gemini_error_mid_stream_raises_in_the_sdk() -> None:
    final = GatewayError("upstream_error", "the upstream broke off after 3 tokens")
    client = gemini_client(Scripted(PROVIDERS.by_name["gemini"], token_faithful(FINALS["text_only"])[:8], final))
    with pytest.raises(genai_errors.APIError):
        list(client.models.generate_content_stream(**GEMINI_KW))


def test_late_text_after_an_emitted_call_keeps_every_piece() -> None:
    """Text the model writes after a tool call it already streamed cannot go back before the call: the
    stream sends it after. The text and the calls are all there; only their order differs from the answer."""
    final = result(TEXT + "\n\nDone.", None, (PARIS,), "tool_calls")
    steps = [("open", 31), *[TextDelta(t) for t in tokens(TEXT)],
             ToolCallDelta(0, PARIS.arguments, id=PARIS.id, name=PARIS.name, complete=True), TextDelta("\n\nDone.")]
    client = anthropic_client(Scripted(PROVIDERS.by_name["anthropic"], steps, final))
    with client.messages.stream(**ANTHROPIC_KW) as stream:
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["text", "tool_use", "text"]
    assert "".join(b.text for b in message.content if b.type == "text") == final.content
