"""The sandbox polar falls back to where vLLM's renderer refuses a template (polar/tokens/sandbox.py): it renders what
transformers renders wherever transformers renders (every family's real template), keeps every other sandbox rule,
never lets a template change the caller's messages or the tool copies shared between renders, and is taken only
where vLLM's renderer raises; chat mode (vLLM renders) refuses a conversation vLLM cannot render, saying why."""

from __future__ import annotations

import asyncio

import pytest
from jinja2.exceptions import SecurityError

from polar.canonical import ChatRequest, Message, TextPart, ToolCall
from polar.errors import GatewayError
from polar.tokens.sandbox import render_with_own_data
from polar.tokens.template import ChatTemplate
from polar.upstream.vllm_chat import VLLMChat
from tests.conftest import FAMILY_TEMPLATES, family_template
from tests.tokens.test_template import SHAPES, TOOLS, shape

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


@pytest.mark.parametrize("label", sorted(set(FAMILY_TEMPLATES) - {"kimi-k2-instruct", "kimi-k2-thinking"}))
def test_it_renders_what_transformers_renders(label, tokenizer):
    text = family_template(label).read_text()
    vllm, own = ChatTemplate(tokenizer, text), ChatTemplate(tokenizer, text)
    own.vllm_refusal = "(this test: every render in jinja2's sandbox)"
    compared = 0
    for name in SHAPES:
        for thinking in (True, False):
            before, sampled, after = shape(name, thinking)
            messages = [*before, sampled, *after]
            try:
                expected = vllm.render(messages, TOOLS, True, thinking)
            except GatewayError as exc:  # the template refuses the conversation (Llama-3.3: parallel calls)
                with pytest.raises(GatewayError) as err:
                    own.render(messages, TOOLS, True, thinking)
                assert err.value.message == exc.message
                continue
            assert own.render(messages, TOOLS, True, thinking) == expected, (name, thinking)
            compared += 1
    # Mistral-Small-3.2 refuses these call ids (not 9 alphanumerics): both raise the template's same error
    assert vllm.vllm_refusal is None and compared >= (0 if label == "mistral-small-3.2" else 4)


MUTATES_INPUT = ("{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}"
                 "{% set _ = tools[0].update({'type': 'changed'}) %}{{ messages | length }} {{ tools[0].type }}")


def test_the_template_changes_only_its_own_copies():
    messages = [{"role": "user", "content": "hi"}]
    tools = [dict(TOOLS[0])]
    for _ in range(2):  # the second render sees fresh copies again
        assert render_with_own_data(MUTATES_INPUT, messages, tools, SPECIAL) == "2 changed"
    assert messages == [{"role": "user", "content": "hi"}] and tools[0]["type"] == "function"


@pytest.mark.parametrize("escape", ["{{ ''.__class__.__mro__ }}", "{{ messages.__class__.__base__ }}",
                                    "{% set ns = namespace(_x=1) %}", "{{ cycler.__init__.__globals__ }}"])
def test_every_other_sandbox_rule_stays(escape):
    with pytest.raises(SecurityError):
        render_with_own_data(escape, [{"role": "user", "content": "hi"}], None, SPECIAL)
    # str.format goes through the sandbox's formatter: an underscore attribute comes out empty
    assert render_with_own_data("{{ messages[0].content.format(messages) }}", [{"role": "user", "content": "{0.__class__}"}],
                                None, SPECIAL) == ""


def test_only_a_template_vllm_refuses_takes_it(tokenizer):
    tok = tokenizer
    queue = "{% set ns = namespace(ids=[]) %}{% set _ = ns.ids.append(1) %}{{ ns.ids }}{{ messages[0].content }}"
    ct = ChatTemplate(tok, queue)
    assert ct.vllm_refusal is None and ct.render([{"role": "user", "content": "hi"}]) == "[1]hi"
    assert ct.vllm_refusal == "SecurityError: access to attribute 'append' of 'list' object is unsafe."
    with pytest.raises(GatewayError, match="cannot render these messages: .*unsafe"):
        ChatTemplate(tok, "{{ ''.__class__.__mro__ }}").render([{"role": "user", "content": "hi"}])


def _request(with_call: bool) -> ChatRequest:
    messages = [Message(role="user", content=[TextPart(text="list files")])]
    if with_call:
        messages += [Message(role="assistant", tool_calls=[ToolCall(id="c1", name="bash", arguments='{"cmd": "ls"}')]),
                     Message(role="tool", tool_call_id="c1", content=[TextPart(text="a.txt")])]
    return ChatRequest(model="m", messages=messages)


@pytest.mark.parametrize("label", ["kimi-k2-instruct", "kimi-k2-thinking"])
def test_chat_mode_refuses_a_tool_call_vllm_cannot_render(label):
    """Chat mode told the template (`polar_chat_template`): a conversation holding a tool call is a 400 invalid_request
    (each provider writes it in its own error shape) naming vLLM's error and token-faithful mode; before any call the
    request goes to vLLM as ever."""
    chat = VLLMChat("http://127.0.0.1:9", model="m", chat_template=str(family_template(label)))
    body = asyncio.run(chat.chat_body(_request(False)))
    assert body["messages"] == [{"role": "user", "content": "list files"}]
    with pytest.raises(GatewayError) as err:
        asyncio.run(chat.chat_body(_request(True)))
    assert err.value.kind == "invalid_request"
    assert "vLLM's chat endpoint" in err.value.message and "'append'" in err.value.message
    assert "token-faithful" in err.value.message
    ok = VLLMChat("http://127.0.0.1:9", model="m", chat_template=str(family_template("kimi-k2")))
    assert asyncio.run(ok.chat_body(_request(True)))["messages"][1]["tool_calls"]
