"""Splicing a moved turn's sampled ids (sessions/splice.py) on the real Qwen3.5 template: the ids it builds,
the cuts it refuses, and tool-call ids matched by their letters and digits (sessions/fingerprints.py)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from polar.canonical import ChatRequest, ChatResult, Message, TextPart, ToolCall
from polar.sessions.fingerprints import answer_message, message_fingerprint
from polar.sessions.splice import splice
from polar.sessions.state import SessionState, new_turn
from polar.tokens import ChatTemplate
from polar.tokens.messages import to_openai_messages
from tests.conftest import real_template


@pytest.fixture(scope="module")
def template(tokenizer_dir) -> ChatTemplate:
    return ChatTemplate(AutoTokenizer.from_pretrained(str(tokenizer_dir)), real_template("qwen3.5-4b").read_text(),
                        name="qwen3.5-4b")


def text(role: str, body: str) -> Message:
    return Message(role=role, content=[TextPart(text=body)])


def tool(call_id: str, body: str) -> Message:
    return Message(role="tool", content=[TextPart(text=body)], tool_call_id=call_id)


CALL = ToolCall(id="call_ab12", name="exec", arguments='{"command": "ls"}')
SYSTEM, TASK = text("system", "Use exec."), text("user", "List the files.")


def sampled_turn(template: ChatTemplate, messages: list[Message], answer: ChatResult) -> tuple[SessionState, list[int]]:
    """A session holding one turn: `messages` rendered whole, then the answer's text encoded as if sampled."""
    request = ChatRequest(model="m", messages=messages)
    prompt = template.prompt_ids([m for msg in messages for m in to_openai_messages(msg)])
    sampled = template.encode("<tool_call>\n<function=exec>\n<parameter=command>\nls\n</parameter>\n</function>\n"
                              "</tool_call><|im_end|>")
    answer = answer.model_copy(update={"prompt_token_ids": prompt, "completion_token_ids": sampled})
    state = SessionState()
    state.add(new_turn(1, request, [message_fingerprint(m) for m in messages], answer), keep=16)
    return state, sampled


def answered(calls: list[ToolCall]) -> ChatResult:
    return ChatResult(id="r", model="m", created=0, content="", tool_calls=calls)


def test_a_moved_context_message_keeps_the_sampled_ids(template):
    state, sampled = sampled_turn(template, [SYSTEM, TASK, text("user", "[context] 0")], answered([CALL]))
    replayed = answer_message(answered([CALL.model_copy(update={"id": "callab12"})]))  # OpenClaw's spelling
    messages = [SYSTEM, TASK, replayed, tool("callab12", "a b"), text("user", "[context] 1")]
    request = ChatRequest(model="m", messages=messages)
    keys = [message_fingerprint(m) for m in messages]
    assert state.extension(request, keys)[0] is None  # the moved message: no turn is a prefix
    found = state.reappearance(request, keys)
    assert found is not None and found.kept == 2
    ext, why = splice(found, request, template)
    assert ext is not None, why
    # The kept history's ids, the generation prompt, the sampled ids untouched: what an extension starts from.
    head = template.prompt_ids([m for msg in [SYSTEM, TASK] for m in to_openai_messages(msg)])
    assert ext.turn.ids.array().tolist() == head + sampled
    assert ext.turn.prompt_len == len(head) and [m.role for m in ext.new_messages] == ["tool", "user"]


def test_a_cut_inside_a_grouped_block_is_refused(template):
    """Two tool results render as one block: dropping the second cannot be cut at a turn boundary."""
    first = ToolCall(id="c1", name="exec", arguments='{"command": "a"}')
    second = ToolCall(id="c2", name="exec", arguments='{"command": "b"}')
    earlier = answer_message(answered([first, second]))
    state, _ = sampled_turn(template, [SYSTEM, TASK, earlier, tool("c1", "A"), tool("c2", "B")], answered([CALL]))
    messages = [SYSTEM, TASK, earlier, tool("c1", "A"), answer_message(answered([CALL])), tool("call_ab12", "x")]
    request = ChatRequest(model="m", messages=messages)
    found = state.reappearance(request, [message_fingerprint(m) for m in messages])
    assert found is not None and found.kept == 4
    ext, why = splice(found, request, template)
    assert ext is None and "not what the template renders" in why


def test_another_thinking_mode_is_not_spliced(template):
    state, _ = sampled_turn(template, [SYSTEM, TASK, text("user", "[context] 0")], answered([CALL]))
    messages = [SYSTEM, TASK, answer_message(answered([CALL])), tool("call_ab12", "a"), text("user", "[context] 1")]
    request = ChatRequest(model="m", messages=messages, thinking={"enabled": True})
    assert state.reappearance(request, [message_fingerprint(m) for m in messages]) is None  # tools/thinking differ


def test_tool_call_ids_match_by_letters_and_digits():
    ours = answer_message(answered([CALL]))
    assert message_fingerprint(answer_message(answered([CALL.model_copy(update={"id": "callab12"})]))) == \
        message_fingerprint(ours)
    assert message_fingerprint(tool("callab12", "x")) == message_fingerprint(tool("call_ab12", "x"))
    assert message_fingerprint(tool("call_ab13", "x")) != message_fingerprint(tool("call_ab12", "x"))
