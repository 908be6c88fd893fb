"""ChatTemplate: rendering as vLLM does, and token-faithful continuations, over the real Qwen3.5 vocabulary.

Templates: the project's own (always present) and the reference ones in ../shared (skipped when absent).
The core claim: `previous prompt ids + sampled ids + continuation ids` is exactly what a full re-render
gives wherever the template keeps its prefix, and differs only where the template is known to break it.
"""

from __future__ import annotations

import json

import pytest

from polar.canonical import Message, Reasoning, TextPart, Tool, ToolCall
from polar.errors import GatewayError
from polar.tokens import ChatTemplate
from polar.tokens.template import PROBE_SENTINEL
from tests.tokens.conftest import PROJECT_TEMPLATE, TEMPLATES

IM_END, ENDOFTEXT = 248046, 248044

# -- conversations ---------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}


def call(cid: str, name: str, args: dict) -> dict:
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(thinking: bool, content: str = "", calls: list[dict] | None = None, reasoning: str = "") -> dict:
    msg = {"role": "assistant", "content": content}
    if thinking:
        msg["reasoning_content"] = reasoning or "Let me think about what to do next."
    if calls:
        msg["tool_calls"] = calls
    return msg


def tool(cid: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": text}


def shape(name: str, thinking: bool) -> tuple[list[dict], dict, list[dict]]:
    """(messages before the sampled turn, the sampled assistant message, the messages that follow it)."""
    user = {"role": "user", "content": "List the files, then count them."}
    if name == "tool_result":
        sampled = assistant(thinking, calls=[call("c1", "bash", {"cmd": "ls -la"})])
        return [SYSTEM, user], sampled, [tool("c1", "a.txt\nb.txt")]
    if name == "parallel_tools":
        calls = [call("c1", "read_file", {"path": "a.txt"}), call("c2", "bash", {"cmd": "wc -l b.txt", "timeout": 5})]
        return [SYSTEM, user], assistant(thinking, "Reading both.", calls), [tool("c1", "alpha"), tool("c2", "3 b.txt")]
    if name == "user_after_tools":
        first = assistant(thinking, calls=[call("c1", "bash", {"cmd": "ls"})])
        before = [SYSTEM, user, first, tool("c1", "a.txt\nb.txt")]
        return before, assistant(thinking, "There are 2 files."), [{"role": "user", "content": "Now delete them."}]
    if name == "non_ascii":
        user = {"role": "user", "content": "Lis «données/日本.txt» — naïve café ☕"}
        calls = [call("c1", "read_file", {"path": "données/日本.txt"})]
        sampled = assistant(thinking, "Je lis le fichier…", calls, "Il faut lire «日本».")
        return [SYSTEM, user], sampled, [tool("c1", "内容: ünïcödé ✓")]
    raise ValueError(name)


SHAPES = ["tool_result", "parallel_tools", "user_after_tools", "non_ascii"]


def prefix_holds_expected(template: str, shape_name: str, thinking: bool) -> bool:
    """The measured (and documented) prefix behaviour: does render(n+1) start with render(n)?"""
    user_appended = shape_name == "user_after_tools"
    if template == "qwen3.5-4b":  # earlier reasoning (even an empty think block) is cut once a user query follows
        return not user_appended
    if template in ("qwen3-hybrid", "qwen3-early"):
        # the last assistant turn's think block survives a tool result only when it has reasoning text
        return thinking and not user_appended
    return True  # project (keeps every think block), qwen3-coder and qwen2.5 (never render reasoning)


def sampled_turn(ct: ChatTemplate, before: list[dict], msg: dict, thinking: bool) -> tuple[str, str]:
    """(the prompt the model saw, the text it sampled, end-of-turn marker included), as the template renders it."""
    prompt = ct.render(before, TOOLS, True, thinking)
    whole = ct.render([*before, msg], TOOLS, False, thinking)
    assert whole.startswith(prompt), "the generation prompt must be how the template opens an assistant turn"
    rest = whole[len(prompt):]
    cut = rest.index(ct.end_of_turn) + len(ct.end_of_turn)
    return prompt, rest[:cut]


# -- (1) the prefix table ------------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("template", TEMPLATES)
def test_prefix_table(load, template, thinking):
    """README table: Qwen3 hybrid breaks on tool result (empty think) and user; Qwen3.5 holds on tools,
    breaks on user; Qwen3-Coder and Qwen2.5 hold on both. The project template holds everywhere."""
    ct = load(template)
    for name in ("tool_result", "user_after_tools"):
        before, msg, new = shape(name, thinking)
        shorter = ct.render([*before, msg], TOOLS, False, thinking)
        longer = ct.render([*before, msg, *new], TOOLS, False, thinking)
        assert longer.startswith(shorter) is prefix_holds_expected(template, name, thinking), (template, name)


# -- (2) token-faithful prompts vs full re-render --------------------------------------------------------


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("shape_name", SHAPES)
@pytest.mark.parametrize("template", TEMPLATES)
def test_continuation_matches_full_render_where_the_template_holds(load, template, shape_name, thinking):
    ct = load(template)
    before, msg, new = shape(shape_name, thinking)
    prompt, sampled = sampled_turn(ct, before, msg, thinking)
    sampled_ids = ct.encode(sampled)
    assert sampled_ids[-1] == ct.end_of_turn_id

    cont = ct.continuation(new, TOOLS, thinking, previous_ended_with_eos=True)
    faithful = ct.encode(prompt) + sampled_ids + cont.ids
    full_text = ct.render([*before, msg, *new], TOOLS, True, thinking)

    assert cont.failure is None and not cont.closed_truncated_turn
    assert cont.text.startswith(cont.bridge) and cont.bridge == "\n"
    assert ct.decode(faithful) == prompt + sampled + cont.text  # what the model actually sees
    assert full_text.endswith(cont.text)  # the new messages render as in a full render, whatever breaks earlier
    if prefix_holds_expected(template, shape_name, thinking):
        assert faithful == ct.encode(full_text)
    else:
        assert faithful != ct.encode(full_text)


@pytest.mark.parametrize("template", ["qwen2.5", "qwen3-hybrid"])
def test_compact_json_sample_is_kept_where_a_rerender_reserialises_it(load, template):
    """The model writes compact JSON; vLLM re-renders arguments with json.dumps spacing. Token-faithful keeps
    the sampled ids; a full re-render of the parsed message drifts even for a template that holds its prefix."""
    ct = load(template)
    before = [SYSTEM, {"role": "user", "content": "Count the files."}]
    prompt = ct.render(before, TOOLS, True, True)
    think = "<think>\nCount with wc.\n</think>\n\n" if template == "qwen3-hybrid" else ""
    sampled = think + '<tool_call>\n{"name": "bash", "arguments": {"cmd":"ls|wc -l","timeout":3}}\n</tool_call>'
    sampled += "<|im_end|>"
    sampled_ids = ct.encode(sampled)
    turn = ct.parse(sampled, enable_thinking=True, finish_reason="stop", tools=TOOLS)
    assert turn.tool_calls[0].arguments == '{"cmd":"ls|wc -l","timeout":3}' and not turn.malformed

    msg = Message(role="assistant", content=[], tool_calls=turn.tool_calls,
                  reasoning=[Reasoning(text=turn.reasoning)] if turn.reasoning else [])
    new = [tool(turn.tool_calls[0].id, "2")]
    faithful = ct.encode(prompt) + sampled_ids + ct.continuation(new, TOOLS, True, previous_ended_with_eos=True).ids
    rerender = ct.prompt_ids([*before, msg, *new], TOOLS, True)
    assert '{"cmd":"ls|wc -l","timeout":3}' in ct.decode(faithful)
    assert faithful != rerender and '"cmd": "ls|wc -l"' in ct.decode(rerender)


def test_truncated_turn_is_closed_first(load):
    ct = load("project")
    before, msg, new = shape("tool_result", True)
    prompt, sampled = sampled_turn(ct, before, msg, True)
    truncated_ids = ct.encode(sampled)[:-5]  # cut by max_tokens: no end-of-turn token
    closed = ct.continuation(new, TOOLS, True, previous_ended_with_eos=False)
    normal = ct.continuation(new, TOOLS, True, previous_ended_with_eos=True)
    assert closed.closed_truncated_turn and closed.ids == [ct.end_of_turn_id, *normal.ids]
    seen = ct.decode(ct.encode(prompt) + truncated_ids + closed.ids)
    assert seen.endswith("<|im_end|>\n<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n<think>\n")


def test_long_session_stays_exact_and_cost_follows_the_new_messages(load, monkeypatch):
    """30 tool rounds with user messages between them, chained turn by turn as the session buffer would be:
    the buffer equals a full render at every turn (the project template holds its prefix), while what the
    continuation renders stays the same size as the conversation grows."""
    ct = load("project")
    rendered: list[tuple[int, int]] = []
    original = ct.render

    def spy(messages, *args, **kwargs):
        text = original(messages, *args, **kwargs)
        rendered.append((len(messages), len(text)))
        return text

    conversation = [SYSTEM, {"role": "user", "content": "Start."}]
    buffer = ct.prompt_ids(conversation, TOOLS, True)
    sizes = set()
    for turn in range(30):
        calls = [call(f"c{turn}", "bash", {"cmd": f"echo {turn}"})]
        msg = assistant(True, f"Step {turn}: ünï {'x' * (turn % 4)}", calls)
        prompt = ct.render(conversation, TOOLS, True, True)
        assert ct.encode(prompt) == buffer
        whole = ct.render([*conversation, msg], TOOLS, False, True)
        sampled = whole[len(prompt): whole.rindex("<|im_end|>") + len("<|im_end|>")]
        new = [tool(f"c{turn}", f"out {turn}")]
        if turn % 5 == 4:  # a user message between tool rounds
            new.append({"role": "user", "content": f"Go on {turn}."})
        monkeypatch.setattr(ct, "render", spy)
        rendered.clear()
        cont = ct.continuation(new, TOOLS, True, previous_ended_with_eos=True)
        monkeypatch.setattr(ct, "render", original)
        assert max(n for n, _ in rendered) == 2 + len(new) == cont.rendered_messages
        sizes.add((len(new), cont.rendered_chars - len(cont.text)))
        buffer = buffer + ct.encode(sampled) + cont.ids
        conversation = [*conversation, msg, *new]
        assert buffer == ct.prompt_ids(conversation, TOOLS, True)
    # the probe + tool catalogue part of each rendering is one fixed size, whatever the history length
    assert len({overhead for _, overhead in sizes}) == 1
    assert len(ct.render(conversation, TOOLS, True, True)) > 5 * max(c for _, c in rendered)


# -- what the template reports -------------------------------------------------------------------------------


@pytest.mark.parametrize("template,family,opens", [
    ("project", "qwen3_xml", {None: True, True: True, False: False}),
    ("qwen3.5-4b", "qwen3_xml", {None: True, True: True, False: False}),
    ("qwen3-hybrid", "qwen3", {None: False, True: False, False: False}),
    ("qwen3-early", "qwen3", {None: False, True: False, False: False}),
    ("qwen3-coder", "qwen3_xml", {None: False, True: False, False: False}),
    ("qwen2.5", "qwen3", {None: False, True: False, False: False}),
])
def test_family_generation_prompt_and_end_of_turn(load, template, family, opens):
    ct = load(template)
    assert ct.family == family
    assert {k: ct.generation_prompt_opens_think(k) for k in opens} == opens
    assert ct.generation_prompt(False).startswith("<|im_start|>assistant\n")
    assert (ct.end_of_turn, ct.end_of_turn_id) == ("<|im_end|>", IM_END)


def test_from_dir_reads_generation_config_and_template_path(tokenizer, tokenizer_dir, tmp_path):
    assert ChatTemplate(tokenizer).eos_token_ids == (IM_END,)  # the tokenizer-only dir: its eos token
    for name in ("tokenizer.json", "tokenizer_config.json"):  # no chat_template.jinja here
        (tmp_path / name).symlink_to(tokenizer_dir / name)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END, ENDOFTEXT]}))
    ct = ChatTemplate.from_dir(tmp_path, PROJECT_TEMPLATE)
    assert ct.eos_token_ids == (IM_END, ENDOFTEXT) and ct.family == "qwen3_xml"
    with pytest.raises(ValueError, match="no chat template"):
        ChatTemplate(ct.tokenizer)


def test_encode_maps_special_tokens_and_adds_none(load):
    ct = load("project")
    ids = ct.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == 248045 and IM_END in ids and ct.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n"


# -- rendering as vLLM does -----------------------------------------------------------------------------------


def test_arguments_text_is_parsed_before_templating_and_canonical_inputs_match_dicts(load):
    ct = load("project")
    as_text = [{"role": "user", "content": "go"},
               assistant(False, "ok", [call("c1", "bash", {"cmd": "ls", "timeout": 9})])]
    as_obj = json.loads(json.dumps(as_text))
    as_obj[1]["tool_calls"][0]["function"]["arguments"] = {"cmd": "ls", "timeout": 9}
    canonical = [
        Message(role="user", content=[TextPart(text="go")]),
        Message(role="assistant", content=[TextPart(text="ok")],
                tool_calls=[ToolCall(id="c1", name="bash", arguments='{"cmd":"ls","timeout":9}')]),
    ]
    tools = [Tool(name=t["function"]["name"], description=t["function"]["description"],
                  parameters=t["function"]["parameters"]) for t in TOOLS]
    expected = ct.render(as_obj, TOOLS, True, False)
    assert ct.render(as_text, TOOLS, True, False) == expected
    assert ct.render(canonical, tools, True, False) == expected
    assert "<parameter=timeout>\n9\n</parameter>" in expected
    assert as_text[1]["tool_calls"][0]["function"]["arguments"] == '{"cmd": "ls", "timeout": 9}'  # inputs untouched


def test_template_and_argument_errors_are_invalid_requests(load):
    ct = load("project")
    bad_args = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{not json"}}]}]
    with pytest.raises(GatewayError) as err:
        ct.render(bad_args, TOOLS)
    assert err.value.kind == "invalid_request" and "arguments" in err.value.message
    with pytest.raises(GatewayError) as err:
        ct.render([{"role": "wizard", "content": "x"}])
    assert err.value.kind == "invalid_request" and "wizard" in err.value.message
    with pytest.raises(GatewayError):
        ct.render(["not a message"])


def test_continuation_fails_when_the_template_rejects_new_messages_alone(load):
    ct = load("qwen3.5-4b")
    cont = ct.continuation([{"role": "system", "content": "late reminder"}], TOOLS, True, previous_ended_with_eos=True)
    assert cont.ids == [] and "System message must be at the beginning" in cont.failure
    # the hybrid template renders a late system message, so it continues
    hybrid = load("qwen3-hybrid").continuation([{"role": "system", "content": "late"}], TOOLS, True,
                                              previous_ended_with_eos=True)
    assert hybrid.text == "\n<|im_start|>system\nlate<|im_end|>\n<|im_start|>assistant\n"


def test_continuation_fails_without_a_stop_token_after_assistant_content(tokenizer):
    plain = ChatTemplate(tokenizer, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                                    "{% if add_generation_prompt %}assistant:{% endif %}")
    assert (plain.family, plain.end_of_turn, plain.end_of_turn_id) == ("plain", None, None)
    cont = plain.continuation([tool("c1", "x")], None, None, previous_ended_with_eos=True)
    assert cont.ids == [] and "stop token" in cont.failure


def test_continuation_fails_when_the_turn_end_changes_with_what_follows(tokenizer):
    # ends an assistant turn with "<|im_end|>\n" at the end of the conversation but "<|im_end|>" + "--" mid-way
    text = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>"
            "{{ '\\n' if loop.last else '--' }}{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    cont = ChatTemplate(tokenizer, text).continuation([tool("c1", "x")], None, None, previous_ended_with_eos=True)
    assert cont.ids == [] and "differently" in cont.failure


def test_probe_sentinel_in_new_messages_does_not_confuse_the_cut(load):
    ct = load("project")
    cont = ct.continuation([{"role": "user", "content": f"quote: {PROBE_SENTINEL}<|im_end|>\n"}], None, False,
                           previous_ended_with_eos=True)
    assert cont.text.startswith("\n<|im_start|>user\nquote: ")
