"""Chat mode (vLLM renders) on Kimi-K2-Instruct's real template, which vLLM's renderer refuses once a conversation
holds a tool call (its `.append`: docs/templates.md): polar, told the template (`polar_chat_template`), answers the
first turn through vLLM as ever and refuses the next, which holds the model's tool call, with a 400 in the caller's
own error format naming vLLM's error and token-faithful mode, before vLLM sees it. The official SDKs read the errors.
The double renders with the same template and vocabulary (a stand-in: Qwen3.5's plus Kimi's special tokens)."""

from __future__ import annotations

import uuid

import anthropic
import openai
import pytest

from tests.conftest import family_template, subprocess_stack
from tests.e2e.sessions import TOOLS
from tests.support.stand_in import family_dir

pytestmark = pytest.mark.slow
CALL = [{"content": "", "tool_calls": [{"name": "read_file", "arguments": {"path": "src/app.py"}}]}]


@pytest.fixture(scope="module")
def kimi_chat(tokenizer_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("kimi-chat")
    vocab = family_dir(tokenizer_dir, root / "vocab", "kimi_k2")
    template = family_template("kimi-k2-instruct")
    with subprocess_stack(vocab, template, "kimi-k2-instruct", root / "captures.db", token_faithful=False) as stack:
        yield stack


def test_openai_chat_gets_a_400_once_a_tool_call_is_in_the_conversation(kimi_chat):
    kimi_chat.script(steps=CALL)
    client = openai.OpenAI(base_url=f"{kimi_chat.url}/v1", api_key="sk",
                           default_headers={"x-polar-session": f"kimi-chat-{uuid.uuid4().hex[:6]}"})
    tools = [{"type": "function", "function": t} for t in TOOLS]
    messages: list[dict] = [{"role": "user", "content": "Fix the bug in src/app.py."}]
    first = client.chat.completions.create(model="m", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "read_file"  # the first turn: vLLM rendered it (no tool call in it yet)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "def add(a, b): return a-b"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=messages, tools=tools)
    body = err.value.body
    assert body["type"] == "invalid_request_error" and "vLLM's chat endpoint" in body["message"]
    assert "'append'" in body["message"] and "token-faithful" in body["message"]


def test_anthropic_messages_gets_its_own_400(kimi_chat):
    kimi_chat.script(steps=CALL)
    client = anthropic.Anthropic(base_url=kimi_chat.url, api_key="sk-ant",
                                 default_headers={"x-polar-session": f"kimi-chat-{uuid.uuid4().hex[:6]}"})
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]
    messages: list[dict] = [{"role": "user", "content": "Fix the bug in src/app.py."}]
    first = client.messages.create(model="claude-sonnet-4-5", max_tokens=200, messages=messages, tools=tools)
    use = next(b for b in first.content if b.type == "tool_use")
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "x"}]}]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=200, messages=messages, tools=tools)
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "vLLM's chat endpoint" in err.value.body["error"]["message"]
