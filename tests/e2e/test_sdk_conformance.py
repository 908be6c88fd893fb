"""The official SDKs, as clients of a running polar, against the scripted vLLM double.

Each provider × {text, tool call, parallel tool calls, thinking} × {non-streamed, streamed}:
the SDK must parse polar's answer without error and see the scripted content, and the call
must land in the capture store with the sampled token ids the upstream produced.
"""

from __future__ import annotations

import json
import uuid

import pytest

SCENARIOS = {
    "text": {"content": "Hello from polar — ünïcode ✓"},
    "tool": {"content": "", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    "parallel": {
        "content": "Checking both.",
        "tool_calls": [
            {"name": "get_weather", "arguments": {"city": "Paris"}},
            {"name": "get_weather", "arguments": {"city": "東京"}},
        ],
    },
    "thinking": {"reasoning": "The user wants the answer; it is 42.", "content": "42"},
}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PROMPT = "What is the weather in Paris?"


def expected_calls(scenario: str) -> list[tuple[str, dict]]:
    return [(c["name"], c["arguments"]) for c in SCENARIOS[scenario].get("tool_calls", [])]


def check_capture(stack, session: str, scenario: str, stream: bool) -> None:
    rows = stack.rows(session)
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["status"] == "ok" and row["http_status"] == 200
    assert row["stream"] == int(stream)
    tok = stack.double.tokenizer
    sampled = tok.decode(row["completion_ids"], skip_special_tokens=False)
    assert row["completion_ids"][-1] == tok.convert_tokens_to_ids("<|im_end|>")
    step = SCENARIOS[scenario]
    assert step["content"] in sampled
    if step.get("reasoning"):
        assert step["reasoning"] in sampled
    assert len(row["completion_logprobs"]) == len(row["completion_ids"])
    assert row["prompt_ids"] and row["prompt_len"] == len(row["prompt_ids"])
    assert PROMPT in tok.decode(row["prompt_ids"])


# -- Anthropic Messages ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_anthropic_sdk(any_stack, scenario, stream):
    stack = any_stack
    import anthropic

    session = f"anth-{uuid.uuid4().hex[:8]}"
    stack.script(steps=[SCENARIOS[scenario]])
    client = anthropic.Anthropic(base_url=stack.url, api_key="sk-ant-test", default_headers={"x-polar-session": session})
    kwargs = dict(
        model="claude-sonnet-4-5",
        max_tokens=2048,
        messages=[{"role": "user", "content": PROMPT}],
        tools=[{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}],
    )
    if scenario == "thinking":
        kwargs["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    if stream:
        with client.messages.stream(**kwargs) as s:
            message = s.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    assert message.model == "claude-sonnet-4-5"
    texts = [b.text for b in message.content if b.type == "text"]
    calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    step = SCENARIOS[scenario]
    if step["content"]:
        assert "".join(texts) == step["content"]
    assert calls == expected_calls(scenario)
    assert message.stop_reason == ("tool_use" if calls else "end_turn")
    if scenario == "thinking":
        thinking = [b for b in message.content if b.type == "thinking"]
        assert thinking[0].thinking == step["reasoning"] and thinking[0].signature
    assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0
    check_capture(stack, session, scenario, stream)


# -- OpenAI Chat Completions -----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_openai_chat_sdk(any_stack, scenario, stream):
    stack = any_stack
    import openai

    session = f"chat-{uuid.uuid4().hex[:8]}"
    stack.script(steps=[SCENARIOS[scenario]])
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk-test", default_headers={"x-polar-session": session})
    kwargs = dict(
        model="gpt-5",
        messages=[{"role": "user", "content": PROMPT}],
        tools=[{"type": "function", "function": WEATHER}],
    )
    if scenario == "thinking":
        kwargs["reasoning_effort"] = "medium"
    step = SCENARIOS[scenario]
    if stream:
        content, reasoning, calls, finish, usage = "", "", {}, None, None
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
            usage = chunk.usage or usage
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning") or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                entry["name"] += (tc.function.name or "") if tc.function else ""
                entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = chunk.choices[0].finish_reason or finish
        got_calls = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
        assert usage is not None and usage.completion_tokens > 0
    else:
        completion = client.chat.completions.create(**kwargs)
        choice = completion.choices[0]
        content = choice.message.content or ""
        reasoning = (choice.message.model_extra or {}).get("reasoning") or ""
        got_calls = [(tc.function.name, json.loads(tc.function.arguments)) for tc in choice.message.tool_calls or []]
        finish = choice.finish_reason
        assert completion.model == "gpt-5" and completion.usage.completion_tokens > 0
    assert content == step["content"]
    assert got_calls == expected_calls(scenario)
    assert finish == ("tool_calls" if got_calls else "stop")
    if scenario == "thinking":
        assert reasoning == step["reasoning"]
    check_capture(stack, session, scenario, stream)


# -- OpenAI Responses -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_openai_responses_sdk(any_stack, scenario, stream):
    stack = any_stack
    import openai

    session = f"resp-{uuid.uuid4().hex[:8]}"
    stack.script(steps=[SCENARIOS[scenario]])
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk-test", default_headers={"x-polar-session": session})
    kwargs = dict(model="gpt-5-codex", input=PROMPT, tools=[{"type": "function", "strict": False, **WEATHER}])
    if scenario == "thinking":
        kwargs["reasoning"] = {"effort": "medium", "summary": "auto"}
    if stream:
        with client.responses.stream(**kwargs) as s:
            response = s.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    assert response.status == "completed" and response.id.startswith("resp_")
    step = SCENARIOS[scenario]
    assert response.output_text == step["content"]
    calls = [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"]
    assert calls == expected_calls(scenario)
    if scenario == "thinking":
        reasoning = [i for i in response.output if i.type == "reasoning"]
        texts = [s.text for s in reasoning[0].summary] + [c.text for c in reasoning[0].content or []]
        assert step["reasoning"] in texts
    assert response.usage.output_tokens > 0
    check_capture(stack, session, scenario, stream)


# -- Google generateContent ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_gemini_sdk(any_stack, scenario, stream):
    stack = any_stack
    from google import genai
    from google.genai import types

    session = f"gem-{uuid.uuid4().hex[:8]}"
    stack.script(steps=[SCENARIOS[scenario]])
    client = genai.Client(
        api_key="gm-test", http_options=types.HttpOptions(base_url=stack.url, headers={"x-polar-session": session})
    )
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**WEATHER)])],
        thinking_config=types.ThinkingConfig(include_thoughts=True) if scenario == "thinking" else None,
    )
    kwargs = dict(model="gemini-2.5-pro", contents=PROMPT, config=config)
    if stream:
        chunks = list(client.models.generate_content_stream(**kwargs))
        parts = [p for c in chunks for cand in c.candidates or [] for p in (cand.content.parts or [])]
        finish = chunks[-1].candidates[0].finish_reason
        usage = chunks[-1].usage_metadata
    else:
        response = client.models.generate_content(**kwargs)
        parts = response.candidates[0].content.parts
        finish = response.candidates[0].finish_reason
        usage = response.usage_metadata
    step = SCENARIOS[scenario]
    text = "".join(p.text for p in parts if p.text and not p.thought)
    thoughts = "".join(p.text for p in parts if p.text and p.thought)
    calls = [(p.function_call.name, dict(p.function_call.args)) for p in parts if p.function_call]
    assert text == step["content"]
    assert calls == expected_calls(scenario)
    assert finish == types.FinishReason.STOP
    if scenario == "thinking":
        assert thoughts == step["reasoning"]
    assert usage.candidates_token_count > 0
    check_capture(stack, session, scenario, stream)
