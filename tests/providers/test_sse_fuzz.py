"""Property-based fuzzing of the four SSE renderers: any result renders without error, every event is
well-formed, and a client that accumulates the stream's deltas gets back exactly the text, reasoning
and tool-call arguments of the result."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.canonical import (
    ChatRequest,
    ChatResult,
    Message,
    Reasoning,
    TextPart,
    ToolCall,
    Usage,
)
from polar.providers.base import Route
from polar.providers.gemini import GeminiContext
from tests.providers.support import PROVIDERS

BY_NAME = PROVIDERS.by_name

REQUEST = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])], stream=True)
# The smallest request of each format, for the render context its parse gives.
BODIES = {
    "anthropic": {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]},
    "openai_chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "openai_responses": {"model": "m", "input": "hi"},
    "gemini": {"contents": [{"parts": [{"text": "hi"}]}]},
}

json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
tool_calls = st.lists(
    st.builds(
        lambda i, name, args: ToolCall(id=f"call_{i}", name=name, arguments=json.dumps(args, ensure_ascii=False)),
        st.integers(0, 10**6), st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True),
        st.dictionaries(st.text(min_size=1, max_size=10), json_value, max_size=4),
    ),
    max_size=3,
)


@st.composite
def results(draw) -> ChatResult:
    calls = draw(tool_calls)
    reasoning = draw(st.none() | st.text(min_size=1, max_size=300))
    return ChatResult(
        id="fuzz", model="m", created=0, content=draw(st.text(max_size=400)),
        reasoning=Reasoning(text=reasoning) if reasoning else None, tool_calls=calls,
        finish_reason="tool_calls" if calls else draw(st.sampled_from(["stop", "length", "stop_sequence"])),
        usage=Usage(prompt_tokens=draw(st.integers(0, 10**5)), completion_tokens=draw(st.integers(0, 10**5))),
    )


def events(body: bytes) -> list[dict]:
    """The JSON payload of every SSE event (the OpenAI [DONE] sentinel excluded)."""
    out = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if data and data[0] != "[DONE]":
            out.append(json.loads("\n".join(data)))
    return out


def accumulate(provider: str, evs: list[dict]) -> tuple[str, str, list[tuple[str, object]]]:
    text, reasoning, calls = "", "", {}
    for e in evs:
        if provider == "anthropic":
            d = e.get("delta", {})
            if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use":
                calls[e["index"]] = [e["content_block"]["name"], ""]
            elif d.get("type") == "text_delta":
                text += d["text"]
            elif d.get("type") == "thinking_delta":
                reasoning += d["thinking"]
            elif d.get("type") == "input_json_delta":
                calls[e["index"]][1] += d["partial_json"]
        elif provider == "openai_chat":
            for choice in e.get("choices", []):
                d = choice["delta"]
                text += d.get("content") or ""
                reasoning += d.get("reasoning") or ""
                for tc in d.get("tool_calls") or []:
                    entry = calls.setdefault(tc["index"], ["", ""])
                    entry[0] += tc.get("function", {}).get("name") or ""
                    entry[1] += tc.get("function", {}).get("arguments") or ""
        elif provider == "openai_responses":
            if e["type"] == "response.output_text.delta":
                text += e["delta"]
            elif e["type"] == "response.reasoning_summary_text.delta":
                reasoning += e["delta"]
            elif e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call":
                calls[e["output_index"]] = [e["item"]["name"], ""]
            elif e["type"] == "response.function_call_arguments.delta":
                calls[e["output_index"]][1] += e["delta"]
        else:  # gemini
            for part in e["candidates"][0].get("content", {}).get("parts", []):
                if "functionCall" in part:
                    calls[len(calls)] = [part["functionCall"]["name"], json.dumps(part["functionCall"]["args"])]
                elif part.get("thought"):
                    reasoning += part.get("text", "")
                else:
                    text += part.get("text", "")
    return text, reasoning, [(name, json.loads(args or "{}")) for name, args in calls.values()]


def _route(provider: str) -> Route:
    if provider == "gemini":
        return BY_NAME["gemini"].match("POST", "/v1beta/models/m:streamGenerateContent", {"alt": "sse"}, {})
    return Route(BY_NAME[provider], "generate")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=results(), provider=st.sampled_from(["anthropic", "openai_chat", "openai_responses", "gemini"]))
def test_streams_carry_the_result_exactly(result, provider):
    request = REQUEST
    context = BY_NAME[provider].parse(_route(provider), BODIES[provider]).context
    if provider == "gemini":  # thoughts are shown only when the client asked to include them
        context = GeminiContext(include_thoughts=True)
    reply = BY_NAME[provider].render(_route(provider), context, request, result)
    assert reply.status == 200
    text, reasoning, calls = accumulate(provider, events(reply.body))
    assert text == result.content
    assert calls == [(c.name, json.loads(c.arguments)) for c in result.tool_calls]
    if provider != "gemini":
        assert reasoning == (result.reasoning.text if result.reasoning else "")
    # and the non-streamed answer is one well-formed JSON document
    plain = request.model_copy(update={"stream": False})
    route = (BY_NAME["gemini"].match("POST", "/v1beta/models/m:generateContent", {}, {})
             if provider == "gemini" else _route(provider))
    reply = BY_NAME[provider].render(route, context, plain, result)
    assert reply.status == 200 and isinstance(json.loads(reply.body), dict)
