"""shape(): requests the real templates accept, with a note per rewrite, and token faithfulness kept.

The traits are measured by rendering the template, so they are checked against what each real
template does (../shared/reference/templates). Codex is the case in point: `instructions` plus
several developer items, and developer items between turns, become system messages that
Qwen3.5's template refuses unless shaped.
"""

from __future__ import annotations

import pytest

from polar.canonical import ChatRequest, ImagePart, Message, TextPart, Tool, ToolCall
from polar.errors import STATUS, GatewayError
from polar.tokens.shaping import (
    LATE_SYSTEM_CLOSE,
    LATE_SYSTEM_OPEN,
    TemplateTraits,
    shape,
)
from polar.tokens.template import openai_messages, openai_tools
from tests.conftest import REAL_TEMPLATES, SHARED_TEMPLATES, family_template

TOOLS = [Tool(name="shell", description="Run a command.",
              parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]})]


def text(role: str, value: str) -> Message:
    return Message(role=role, content=[TextPart(text=value)])


def codex_request(*, late: bool = True) -> ChatRequest:
    """As the Responses provider normalises a Codex call: instructions, two developer items, the task,
    a tool round, then (late) a developer item between turns and the user's next line."""
    messages = [
        text("system", "You are Codex, a coding agent."),  # instructions
        text("system", "<permissions>sandbox: workspace-write</permissions>"),  # developer
        text("system", "<environment_context>cwd: /work/repo</environment_context>"),  # developer
        text("user", "Fix the failing test."),
        Message(role="assistant", content=[],
                tool_calls=[ToolCall(id="c1", name="shell", arguments='{"cmd": "pytest -q"}')]),
        Message(role="tool", tool_call_id="c1", content=[TextPart(text="1 failed")]),
    ]
    if late:
        messages += [text("system", "<environment_context>approval: never</environment_context>"),
                     text("user", "Go on.")]
    return ChatRequest(model="gpt-5-codex", messages=messages, tools=TOOLS)


# -- traits, measured --------------------------------------------------------------------------------


EXPECTED = {  # system_at_start, several_systems, late_system, developer_role, images, tool_role
    "qwen3.5-4b": (True, False, False, False, True, True),
    "qwen3-hybrid": (True, True, True, False, False, True),
    "qwen3-early": (True, True, True, False, False, True),
    "qwen3-coder": (True, True, True, True, False, True),
    "qwen2.5": (True, True, True, False, False, True),
    "project": (True, True, True, False, False, True),
}


@pytest.mark.parametrize("name", [*SHARED_TEMPLATES, "project"])
def test_traits_are_what_the_template_renders(load, name):
    traits = load(name).traits()
    got = (traits.system_at_start, traits.several_systems, traits.late_system, traits.developer_role,
           traits.images, traits.tool_role)
    assert got == EXPECTED[name]
    assert (traits.late_system_error == "System message must be at the beginning.") is (name == "qwen3.5-4b")
    assert traits.label == name and TemplateTraits.of(load(name).template_text) is not traits  # label differs
    assert TemplateTraits.of(load(name).template_text, name) == traits  # cached per text, same answer


# -- shaping Codex-style requests ------------------------------------------------------------------------


def test_codex_request_is_refused_unshaped_by_qwen35(load):
    with pytest.raises(GatewayError, match="System message must be at the beginning"):
        load("qwen3.5-4b").render(codex_request().messages, TOOLS)


@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_codex_request_shaped_renders_and_notes_say_why(load, name):
    ct = load(name)
    request = codex_request()
    before = request.model_dump()
    shaped, notes = shape(request, ct.traits())
    assert request.model_dump() == before  # pure
    assert notes[0] == "merged 3 leading system/developer messages into one system message"
    first = shaped.messages[0]
    assert first.role == "system" and first.text() == (
        "You are Codex, a coding agent.\n\n<permissions>sandbox: workspace-write</permissions>\n\n"
        "<environment_context>cwd: /work/repo</environment_context>")
    late = shaped.messages[4]
    if name == "qwen3.5-4b":
        assert late.role == "user" and late.text() == (
            LATE_SYSTEM_OPEN + "<environment_context>approval: never</environment_context>" + LATE_SYSTEM_CLOSE)
        assert notes[1] == ("system message at position 6 carried as a user message in <system> tags: qwen3.5-4b "
                            "refuses a system message after the start (System message must be at the beginning.)")
    else:  # Qwen3 and Qwen3-Coder render a system turn in place, as vLLM would
        assert late.role == "system" and len(notes) == 1
    rendered = ct.render(shaped.messages, TOOLS)
    assert "approval: never" in rendered and rendered.count("<|im_start|>system") == (1 if name == "qwen3.5-4b" else 2)


# Where each family's real template writes a system message sent after the start (tests/conftest.py FAMILY_TEMPLATES).
LATE_SYSTEM = {"deepseek-v3.1": False, "deepseek-v3.2": False, "deepseek-v4": False,  # into the first system prompt
               "minimax-m2": False, "gpt-oss": False,  # dropped
               "glm-4.6": True, "kimi-k2": True, "llama-3.3": True, "nemotron-3-nano": True}


@pytest.mark.parametrize("label", LATE_SYSTEM)
def test_a_late_system_message_reaches_the_model_where_it_was_sent(label):
    """A late system message counts as taken only when the template writes it between the turns it came between:
    DeepSeek's templates write every system message at the start, before ids already sampled, so it becomes a
    user turn in <system> tags there, as where the template drops it."""
    template = family_template(label).read_text()
    traits = TemplateTraits.of(template, label)
    assert traits.late_system is LATE_SYSTEM[label]
    shaped, notes = shape(codex_request(), traits)
    if traits.late_system:
        assert shaped.messages[4].role == "system" and len(notes) == 1
        return
    assert shaped.messages[4].role == "user" and shaped.messages[4].text() == (
        LATE_SYSTEM_OPEN + "<environment_context>approval: never</environment_context>" + LATE_SYSTEM_CLOSE)
    assert notes[1] == (f"system message at position 6 carried as a user message in <system> tags: {label} renders "
                        "no system message in place after the start")
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered = render_jinja_template(conversations=[openai_messages(shaped.messages)], tools=openai_tools(TOOLS),
                                     chat_template=template, add_generation_prompt=True)[0][0]
    assert rendered.index("1 failed") < rendered.index("approval: never") < rendered.index("Go on.")


def test_nothing_to_rewrite_returns_the_request_itself(load):
    request = ChatRequest(model="m", messages=[text("system", "S"), text("user", "U")])
    assert shape(request, load("qwen3.5-4b").traits()) == (request, [])


def test_a_system_message_first_only_after_a_user_is_late(load):
    request = ChatRequest(model="m", messages=[text("user", "U"), text("system", "S")])
    shaped, notes = shape(request, load("qwen3.5-4b").traits())
    assert [m.role for m in shaped.messages] == ["user", "user"] and "position 1" in notes[0]


def test_shaping_a_longer_conversation_extends_the_shaped_shorter_one(load):
    """Rewrites depend on the message and whether the conversation had started: a session's shaped
    turn N is a prefix of its shaped turn N+1, so token-faithful continuation still applies."""
    traits = load("qwen3.5-4b").traits()
    full = codex_request().messages
    for n in range(4, len(full) + 1):
        shorter, _ = shape(ChatRequest(model="m", messages=full[:n]), traits)
        longer, _ = shape(ChatRequest(model="m", messages=full), traits)
        assert longer.messages[: len(shorter.messages)] == shorter.messages
        assert shape(longer, traits) == (longer, [])  # idempotent: a shaped request needs no more rewrites


# -- images -----------------------------------------------------------------------------------------


IMAGE = ImagePart(media_type="image/png", data="iVBORw0KGgo=")


@pytest.mark.parametrize("name", [n for n in REAL_TEMPLATES if n != "qwen3.5-4b"])
def test_images_on_a_text_only_template_are_a_clear_400(load, name):
    request = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="what is it?"), IMAGE])])
    with pytest.raises(GatewayError) as err:
        shape(request, load(name).traits())
    assert err.value.kind == "invalid_request" and STATUS[err.value.kind] == 400 and err.value.status is None
    assert "messages[0] holds an image" in err.value.message and name in err.value.message


def test_images_pass_where_the_template_renders_them_but_never_in_a_system_message(load):
    ct = load("qwen3.5-4b")
    user = Message(role="user", content=[IMAGE, TextPart(text="what is it?")])
    shaped, notes = shape(ChatRequest(model="m", messages=[user]), ct.traits())
    assert notes == [] and "<|vision_start|><|image_pad|><|vision_end|>what is it?" in ct.render(shaped.messages)
    system = Message(role="system", content=[IMAGE])
    with pytest.raises(GatewayError, match="system message holding an image"):
        shape(ChatRequest(model="m", messages=[system, user]), ct.traits())


# -- token faithfulness across shaped turns ---------------------------------------------------------------


def sampled_turn(ct, messages, reply: Message) -> tuple[list[int], list[int]]:
    """(prompt ids, sampled ids with the end-of-turn token) as the model saw and wrote them."""
    prompt = ct.render(messages, TOOLS)
    whole = ct.render([*messages, reply], TOOLS, add_generation_prompt=False)
    assert whole.startswith(prompt)
    rest = whole[len(prompt):]
    return ct.encode(prompt), ct.encode(rest[: rest.index(ct.end_of_turn) + len(ct.end_of_turn)])


@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_codex_session_stays_token_faithful_across_shaped_turns(load, name):
    """Three Codex turns with developer items between them: each turn's prompt is the previous
    prompt + sampled ids + the continuation of only the new (shaped) messages; the new messages
    render exactly as in a full render, and where the template keeps its prefix (Qwen3-Coder) the
    chained ids equal a full render of the shaped conversation (Qwen3.5 and Qwen3 hybrid re-render
    earlier think blocks differently: that is what the token-faithful buffer avoids)."""
    ct = load(name)
    traits = ct.traits()
    conversation = codex_request(late=False).messages[:4]
    shaped, _ = shape(ChatRequest(model="m", messages=conversation), traits)
    buffer = ct.prompt_ids(shaped.messages, TOOLS)
    replies = [
        Message(role="assistant", content=[TextPart(text="Running the tests.")],
                tool_calls=[ToolCall(id="c1", name="shell", arguments='{"cmd": "pytest -q"}')]),
        Message(role="assistant", content=[TextPart(text="Fixed: add() now adds.")]),
        Message(role="assistant", content=[TextPart(text="Done.")]),
    ]
    follow_ups = [
        [Message(role="tool", tool_call_id="c1", content=[TextPart(text="1 failed")]),
         text("system", "<environment_context>approval: never</environment_context>")],
        [text("system", "<permissions>read-only</permissions>"), text("user", "Anything else?")],
    ]
    for reply, new in zip(replies, [*follow_ups, []]):
        prompt_ids, sampled_ids = sampled_turn(ct, shaped.messages, reply)
        if name == "qwen3-coder":  # holds its prefix for every message kind: a re-render is the buffer
            assert prompt_ids == buffer
        if not new:
            break
        before = len(shaped.messages)
        conversation = [*conversation, reply, *new]
        shaped, notes = shape(ChatRequest(model="m", messages=conversation), traits)
        late = sum(m.role == "system" for m in conversation[4:])
        assert len(notes) == 1 + (late if name == "qwen3.5-4b" else 0)
        new_shaped = shaped.messages[before + 1:]
        cont = ct.continuation(new_shaped, TOOLS, previous_ended_with_eos=True)
        assert cont.failure is None, cont.failure
        full = ct.render(shaped.messages, TOOLS)
        assert full.endswith(cont.text)
        assert ct.decode(cont.ids) == cont.text
        buffer = buffer + sampled_ids + cont.ids


def test_unshaped_late_system_cannot_continue_on_qwen35_but_shaped_can(load):
    ct = load("qwen3.5-4b")
    late = [text("system", "reminder")]
    assert "System message must be at the beginning" in ct.continuation(late, TOOLS, previous_ended_with_eos=True).failure
    started = [text("user", "U"), *late]
    shaped, _ = shape(ChatRequest(model="m", messages=started), ct.traits())
    assert ct.continuation(shaped.messages[1:], TOOLS, previous_ended_with_eos=True).failure is None


# -- the test bed itself ---------------------------------------------------------------------------------


def test_missing_templates_skip_or_fail_as_required(tmp_path, monkeypatch):
    from tests.conftest import templates_dir

    monkeypatch.setenv("POLAR_SHARED", str(tmp_path))
    monkeypatch.delenv("POLAR_REQUIRE_TEMPLATES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="lacks qwen3.5-4b.jinja"):
        templates_dir()
    monkeypatch.setenv("POLAR_REQUIRE_TEMPLATES", "1")
    with pytest.raises(pytest.fail.Exception, match="POLAR_REQUIRE_TEMPLATES=1"):
        templates_dir()
