"""Mistral-Small-3.2's real template makes roles alternate (tool results and calling turns aside) and raises otherwise;
shaping carries a user message it refuses into the message before it, as measured from the template (no name), so
Codex's and Claude Code's conversations render, prefix-stable; Devstral's template takes them as sent."""

from __future__ import annotations

import pytest

from polar.canonical import ChatRequest, Message, TextPart, ToolCall
from polar.errors import GatewayError
from polar.tokens.shaping import shape
from polar.tokens.template import ChatTemplate
from tests.conftest import family_template
from tests.support.tekken_vocab import tekken_vocab_dir
from tests.tokens.parser_corpus import TOOLS


def text(role: str, body: str) -> Message:
    return Message(role=role, content=[TextPart(text=body)])


def called(call_id: str, result: str) -> list[Message]:
    return [Message(role="assistant", content=[], tool_calls=[ToolCall(id=call_id, name="list_dir", arguments="{}")]),
            Message(role="tool", tool_call_id=call_id, content=[TextPart(text=result)])]


@pytest.fixture(scope="module")
def template():
    return lambda label: ChatTemplate.from_dir(tekken_vocab_dir(), family_template(label))


def test_a_refused_user_message_joins_the_one_before_it(template):
    ct = template("mistral-small-3.2")
    traits = ct.traits()
    assert not traits.user_after_tool and not traits.consecutive_users
    # Claude Code: text beside its tool results; Codex: a developer item after a tool output, then the user's words
    first = [text("system", "Be brief."), text("user", "list it"), *called("Zx81kQ0pA", "a.txt"),
             text("user", "<system-reminder>todo list empty</system-reminder>")]
    later = [*first, Message(role="assistant", content=[TextPart(text="Done.")]), text("system", "approval: never"),
             text("user", "Again.")]
    for messages in (first, later):
        with pytest.raises(GatewayError, match="roles must alternate"):
            ct.render(messages, TOOLS)
    shaped_first, notes_first = shape(ChatRequest(model="m", messages=first), traits)
    shaped, notes = shape(ChatRequest(model="m", messages=later), traits)
    assert shaped.messages[: len(shaped_first.messages)] == shaped_first.messages  # prefix-stable
    assert [m.role for m in shaped.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert notes_first == notes[:1] and "carried at the end of the tool result" in notes[0]
    assert "joined to the user message before it" in notes[2] and len(notes) == 3
    rendered = ct.render(shaped.messages, TOOLS)
    assert ("[TOOL_RESULTS]Zx81kQ0pA[TOOL_CONTENT]a.txt\n\n<user>\n<system-reminder>todo list empty</system-reminder>"
            "\n</user>[/TOOL_RESULTS]Done.</s>") in rendered
    assert rendered.endswith("[INST]<system>\napproval: never\n</system>\n\nAgain.[/INST]")


def test_a_late_system_message_after_a_tool_result_keeps_its_tags(template):
    ct = template("mistral-small-3.2")
    messages = [text("user", "list it"), *called("Zx81kQ0pA", "a.txt"), text("system", "approval: never")]
    shaped, notes = shape(ChatRequest(model="m", messages=messages), ct.traits())
    assert len(notes) == 2 and shaped.messages[-1].text() == "a.txt\n\n<system>\napproval: never\n</system>"
    assert "[TOOL_CONTENT]a.txt\n\n<system>\napproval: never\n</system>[/TOOL_RESULTS]" in ct.render(shaped.messages, TOOLS)


def test_devstral_takes_the_same_conversation_as_sent(template):
    ct = template("devstral")
    messages = [text("user", "list it"), *called("call_1", "a.txt"), text("user", "more"), text("user", "and more")]
    assert ct.traits().user_after_tool and ct.traits().consecutive_users
    shaped, notes = shape(ChatRequest(model="m", messages=messages), ct.traits())
    assert notes == [] and shaped.messages == messages
    assert "[TOOL_RESULTS]a.txt[/TOOL_RESULTS][INST]more[/INST][INST]and more[/INST]" in ct.render(messages, TOOLS)
