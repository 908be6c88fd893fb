"""Parsing sampled text into content, reasoning and tool calls: round trips through the real templates,
the model's own writing (compact JSON, typed XML values), truncated and malformed turns, and fuzzing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.canonical import Tool
from polar.tokens import PARSERS, ChatTemplate, family_for_template, parse_turn
from polar.tokens.parsers import Qwen3JsonParser, typed_value
from tests.conftest import SHARED_TEMPLATES
from tests.tokens.conftest import PROJECT_TEMPLATE, TEMPLATES

REASONING_RENDERED = {"project", "qwen3.5-4b", "qwen3-hybrid", "qwen3-early"}  # coder and 2.5 drop it


SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "code": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "force": {"type": "boolean"},
        "opts": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    },
}
TOOLS = [
    {"type": "function", "function": {"name": "edit", "description": "Edit a file.", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "bash", "description": "Run.", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}}}},
]

CASES = {
    "one_call": ("", "", [("bash", {"cmd": "ls -la"})]),
    "reasoning_content_and_parallel_calls": (
        "First read, then edit.", "I will run two tools.",
        [("bash", {"cmd": "cat a.py"}), ("edit", {"path": "a.py", "count": 3, "force": True, "tags": ["x", "y"]})],
    ),
    "non_ascii": ("Il faut «éditer» 日本.", "Je m’en occupe ☕",
                  [("edit", {"path": "données/日本.txt", "code": "print('é')"})]),
    "typed_values": ("", "", [("edit", {"path": "007", "code": "line 1\n  line 2\n", "count": 0, "ratio": 1.5,
                                        "force": False, "opts": {"a": [1, {"b": None}]}, "maybe": 4})]),
    "text_only": ("Nothing to run.", "All done: 2 files.", []),
}


def assistant_message(reasoning: str, content: str, calls: list) -> dict:
    msg = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
            for i, (n, a) in enumerate(calls)
        ]
    return msg


def sampled_text(ct: ChatTemplate, msg: dict, thinking: bool) -> str:
    """The assistant turn as the template renders it, cut where the model would have sampled it."""
    before = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Do the task."}]
    prompt = ct.render(before, TOOLS, True, thinking)
    whole = ct.render([*before, msg], TOOLS, False, thinking)
    assert whole.startswith(prompt)
    return whole[len(prompt): whole.rindex(ct.end_of_turn) + len(ct.end_of_turn)]


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("template", TEMPLATES)
def test_round_trip_through_the_template(load, template, case, thinking):
    ct = load(template)
    reasoning, content, calls = CASES[case]
    reasoning = reasoning if thinking else ""
    text = sampled_text(ct, assistant_message(reasoning, content, calls), thinking)
    turn = ct.parse(text, enable_thinking=thinking, finish_reason="stop", tools=TOOLS)

    assert turn.malformed == [] and not turn.truncated
    assert turn.content == content
    # thinking off: the empty think block is part of the generation prompt, not of the sample
    assert turn.reasoning == (reasoning if thinking and template in REASONING_RENDERED else None)
    assert [c.name for c in turn.tool_calls] == [n for n, _ in calls]
    for got, (_, args) in zip(turn.tool_calls, calls, strict=True):
        assert got.id.startswith("call_") and json.loads(got.arguments) == args
        assert got.arguments == json.dumps(args, ensure_ascii=False)  # JSON: sliced as rendered; XML: written so
    assert len({c.id for c in turn.tool_calls}) == len(calls)


# -- the model's own writing ----------------------------------------------------------------------------


def test_json_arguments_are_sliced_exactly_as_written():
    text = ('Running.\n<tool_call>\n{"name":"bash","arguments":{"cmd":"echo \\u00e9 | wc","n" :  [1,2]}}'
            '\n</tool_call>\n'
            '<tool_call>\n{"arguments": {}, "name": "bash"}\n</tool_call>')
    turn = parse_turn(text, "qwen3", think_open=False, finish_reason="stop", tools=TOOLS)
    assert turn.content == "Running." and turn.malformed == []
    assert [c.arguments for c in turn.tool_calls] == ['{"cmd":"echo \\u00e9 | wc","n" :  [1,2]}', "{}"]


def test_json_arguments_given_as_a_string_or_missing():
    text = ('<tool_call>\n{"name": "bash", "arguments": "{\\"cmd\\": \\"ls\\"}"}\n</tool_call>\n'
            '<tool_call>\n{"name": "bash"}\n</tool_call>')
    turn = parse_turn(text, "qwen3", think_open=False, finish_reason="stop", tools=TOOLS)
    assert [c.arguments for c in turn.tool_calls] == ['{"cmd": "ls"}', "{}"]


def test_reasoning_split_with_open_and_written_think_blocks():
    open_turn = parse_turn("Plan it.\n</think>\n\nDone.", "qwen3_xml", think_open=True, finish_reason="stop", tools=[])
    assert (open_turn.reasoning, open_turn.content, open_turn.malformed) == ("Plan it.", "Done.", [])
    written = parse_turn("<think>\nHmm.\n</think>\n\nOk<|im_end|>", "qwen3", think_open=False, finish_reason="stop",
                         tools=[])
    assert (written.reasoning, written.content) == ("Hmm.", "Ok")
    none = parse_turn("Just text with </think> inside.", "qwen3", think_open=False, finish_reason="stop", tools=[])
    assert (none.reasoning, none.content) == (None, "Just text with </think> inside.")


def test_text_after_and_between_calls_is_kept():
    text = ("Before.\n\n<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>\n"
            "Between.\n<tool_call>\n<function=bash>\n<parameter=cmd>\npwd\n</parameter>\n</function>\n</tool_call>\nAfter.")
    turn = parse_turn(text, "qwen3_xml", think_open=False, finish_reason="stop", tools=TOOLS)
    assert turn.content == "Before.\n\nBetween.\n\nAfter." and len(turn.tool_calls) == 2


@pytest.mark.parametrize("text,schema,expected", [
    ("42", {"type": "integer"}, 42),
    ("4.5", {"type": "number"}, 4.5),
    ("true", {"type": "boolean"}, True),
    ("False", {"type": "boolean"}, False),
    ('{"a": 1}', {"type": "object"}, {"a": 1}),
    ("[1, 2]", {"type": "array"}, [1, 2]),
    ("null", {"type": ["integer", "null"]}, None),
    ("7", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, 7),
    ("42", {"type": "string"}, "42"),
    ("42", {"type": ["string", "integer"]}, "42"),
    ("42", None, "42"),  # a parameter the schema does not declare
    ("42", {"description": "untyped"}, "42"),
    ("forty", {"type": "integer"}, "forty"),  # not JSON: the raw text, never dropped
    ("NaN", {"type": "number"}, "NaN"),
])
def test_xml_values_are_typed_by_the_schema(text, schema, expected):
    assert typed_value(text, schema) == expected


# -- truncated and malformed turns ----------------------------------------------------------------------


def test_truncated_inside_reasoning():
    turn = parse_turn("Thinking about it and", "qwen3_xml", think_open=True, finish_reason="length", tools=TOOLS)
    assert (turn.reasoning, turn.content, turn.truncated, turn.malformed) == ("Thinking about it and", "", True, [])


def test_ended_inside_reasoning_without_truncation_is_marked():
    turn = parse_turn("<think>\nnever closed", "qwen3", think_open=False, finish_reason="stop", tools=TOOLS)
    assert turn.reasoning == "never closed" and "</think>" in turn.malformed[0]


@pytest.mark.parametrize("family,partial", [
    ("qwen3_xml", "<tool_call>\n<function=edit>\n<parameter=code>\nprint("),
    ("qwen3", '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls'),
])
def test_truncated_tool_call_stays_in_content_and_is_reported(family, partial):
    text = "Let me edit.\n\n<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"
    text += "\n"
    if family == "qwen3":
        text = 'Let me edit.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
    turn = parse_turn(text + partial, family, think_open=False, finish_reason="length", tools=TOOLS)
    assert turn.truncated and len(turn.tool_calls) == 1
    assert turn.content == "Let me edit.\n\n" + partial
    assert len(turn.malformed) == 1 and "unfinished tool call" in turn.malformed[0]


@pytest.mark.parametrize("family,block,reason", [
    ("qwen3", '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}\n</tool_call>', "not valid JSON"),
    ("qwen3", '<tool_call>\n["bash"]\n</tool_call>', "not a JSON object"),
    ("qwen3", '<tool_call>\n{"arguments": {}}\n</tool_call>', '"name"'),
    ("qwen3", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', "unknown function 'rm_rf'"),
    ("qwen3", '<tool_call>\n{"name": "bash", "arguments": [1]}\n</tool_call>', "not a JSON object"),
    ("qwen3", '<tool_call>\n{"name": "bash", "arguments": {"x": NaN}}\n</tool_call>', "not valid JSON"),
    ("qwen3_xml", "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>", "unknown function 'rm_rf'"),
    ("qwen3_xml", "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</tool_call>", "never closed"),
    ("qwen3_xml", "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</function>\n</tool_call>", "<parameter"),
    ("qwen3_xml", "<tool_call>\n<function=bash>\nstray\n</function>\n</tool_call>", "outside the <parameter"),
    ("qwen3_xml", "<tool_call>\nbash ls\n</tool_call>", "no <function=NAME>"),
    ("qwen3_xml", "<tool_call>\n<function=>\n</function>\n</tool_call>", "no name"),
    ("qwen3_xml", "<tool_call>\n<function=bash>\n</function>\n", "never closed"),
    ("qwen3_xml", "<tool_call>\n<function=bash>\n</function>\nls\n</tool_call>", "text around"),
    ("qwen3", "<tool_call>\n" + "[" * 100000 + "\n</tool_call>", "not valid JSON"),
])
def test_malformed_calls_are_reported_and_kept_raw(family, block, reason):
    good = ("<tool_call>\n<function=bash>\n<parameter=cmd>\npwd\n</parameter>\n</function>\n</tool_call>"
            if family == "qwen3_xml" else '<tool_call>\n{"name": "bash", "arguments": {"cmd": "pwd"}}\n</tool_call>')
    text = f"Trying.\n{block}\n{good}"
    turn = parse_turn(text, family, think_open=False, finish_reason="stop", tools=TOOLS)
    assert len(turn.malformed) == 1 and reason in turn.malformed[0], turn.malformed
    assert block.strip() in turn.content and turn.content.startswith("Trying.")
    assert [c.name for c in turn.tool_calls] == ["bash"] and "pwd" in turn.tool_calls[0].arguments


def test_no_tools_offered_means_every_call_is_unknown():
    text = "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"
    turn = parse_turn(text, "qwen3_xml", think_open=False, finish_reason="stop", tools=[])
    assert turn.tool_calls == [] and turn.content == text and "tools offered: none" in turn.malformed[0]


# -- families ----------------------------------------------------------------------------------------------


def test_family_detection(shared_templates):
    found = {name: family_for_template((shared_templates / f).read_text()) for name, f in SHARED_TEMPLATES.items()}
    assert found == {"qwen3.5-4b": "qwen3_xml", "qwen3-hybrid": "qwen3", "qwen3-early": "qwen3",
                     "qwen3-coder": "qwen3_xml", "qwen2.5": "qwen3"}
    assert family_for_template(PROJECT_TEMPLATE.read_text()) == "qwen3_xml"
    assert family_for_template("{{ messages }}") == "plain"


def test_plain_family_and_unknown_family():
    turn = parse_turn("<think>\nx\n</think>\n\n<tool_call>raw</tool_call>", "plain", think_open=False,
                      finish_reason="stop", tools=TOOLS)
    assert (turn.reasoning, turn.content, turn.tool_calls) == ("x", "<tool_call>raw</tool_call>", [])
    with pytest.raises(ValueError, match="unknown model family"):
        parse_turn("x", "llama9", think_open=False, finish_reason="stop", tools=[])


def test_a_new_family_is_a_subclass_and_a_registry_entry(monkeypatch):
    class FunctionCallJson(Qwen3JsonParser):
        name = "fc_json"
        call_start, call_end = "<function_call>", "</function_call>"

    monkeypatch.setitem(PARSERS, "fc_json", FunctionCallJson())
    tools = [Tool(name="bash", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}})]
    turn = parse_turn('Ok <function_call>{"name": "bash", "arguments": {"cmd": "ls"}}</function_call>', "fc_json",
                      think_open=False, finish_reason="stop", tools=tools)
    assert turn.content == "Ok" and turn.tool_calls[0].arguments == '{"cmd": "ls"}'


@pytest.mark.parametrize("family", ["qwen3_xml", "qwen3"])
@pytest.mark.parametrize("prompt_tail", ["<think>\n", "</think>\n\n", "<|im_start|>assistant\n"])
def test_agrees_with_the_scripted_vllm_double(family, prompt_tail):
    """The test double writes each family's output its own way; polar's parser reads it as vLLM does (the double
    parses as vLLM 0.32), minus the template glue vLLM keeps around the reasoning and before calls."""
    from polar.doubles.scripted_vllm import ModelFormat, Step
    from polar.upstream.results import content_as_written

    step = Step(reasoning="Look first.", content="Ça va.", tool_calls=[
        {"name": "edit", "arguments": {"path": "é.txt", "count": 2, "opts": {"k": [1]}}},
        {"name": "bash", "arguments": {"cmd": "ls"}}])
    fmt = ModelFormat(family, knows_think=True)
    text = fmt.completion(step, prompt_tail)
    reasoning, content, calls = fmt.parse(text, prompt_tail, TOOLS)
    content = content_as_written(content, reasoning is not None, bool(calls))
    reasoning = reasoning.strip("\n") if reasoning is not None else None
    turn = parse_turn(text, family, think_open=prompt_tail == "<think>\n", finish_reason="stop", tools=TOOLS)
    assert (turn.reasoning, turn.content) == (reasoning, content) and not turn.malformed
    assert (reasoning is None) is (prompt_tail == "</think>\n\n")
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [(c["name"], c["arguments"]) for c in calls]
    assert [c.name for c in turn.tool_calls] == ["edit", "bash"]


# -- property tests: never raise on noise, exact round trips on well-formed output -------------------------

MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<function=bash>", "<function=edit>", "</function>",
          "<parameter=cmd>", "<parameter=count>", "</parameter>", '{"name": "bash", "arguments": ', "{", "}", '"',
          "\n", " ", "ls", "é", "<|im_end|>"]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(MARKUP) | st.text(max_size=4), max_size=30),
       family=st.sampled_from(sorted(PARSERS)), think_open=st.booleans(),
       finish=st.sampled_from(["stop", "length", "tool_calls"]))
def test_noise_never_raises(pieces, family, think_open, finish):
    text = "".join(pieces)
    turn = parse_turn(text, family, think_open=think_open, finish_reason=finish, tools=TOOLS)
    assert turn.truncated == (finish == "length")
    for call in turn.tool_calls:
        assert call.name in ("bash", "edit") and isinstance(json.loads(call.arguments), dict)
    if turn.reasoning is None and not turn.tool_calls:  # nothing recognised: the text comes back whole
        whole = next((text[: -len(s)] for s in PARSERS[family].stop_texts if text.endswith(s)), text)
        # (harmony's turn is messages: white space outside any message is glue, as between its messages)
        assert turn.content == whole or (family == "harmony" and not whole.strip() and turn.content == "")


WORDS = st.text(st.characters(blacklist_characters="<>", blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12)
PLAIN = WORDS.map(str.strip).filter(bool)
VALUES = {
    "path": PLAIN, "code": st.text(st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=20)
    .filter(lambda v: not v.startswith("\n") and not v.endswith("\n")),
    "count": st.integers(-10**6, 10**6), "ratio": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "force": st.booleans(), "tags": st.lists(PLAIN, max_size=3),
    "opts": st.dictionaries(PLAIN, st.integers(), max_size=2),
}
ARGS = st.fixed_dictionaries({}, optional=VALUES)


@settings(max_examples=150, deadline=None)
@given(reasoning=st.none() | PLAIN, content=st.just("") | PLAIN, calls=st.lists(ARGS, max_size=3),
       compact=st.booleans(), ascii_only=st.booleans())
def test_well_formed_output_round_trips(reasoning, content, calls, compact, ascii_only):
    think = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None else ""
    sep = (",", ":") if compact else (", ", ": ")
    json_args = [json.dumps(a, separators=sep, ensure_ascii=ascii_only) for a in calls]
    blocks = [f'<tool_call>\n{{"name": "edit", "arguments": {a}}}\n</tool_call>' for a in json_args]
    xml = [("<tool_call>\n<function=edit>\n" + "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
        for k, v in a.items()) + "</function>\n</tool_call>") for a in calls]
    glue = "\n\n" if content else ""
    for family, rendered in (("qwen3", blocks), ("qwen3_xml", xml)):
        text = think + content + (glue + "\n".join(rendered) if rendered else "") + "<|im_end|>"
        turn = parse_turn(text, family, think_open=False, finish_reason="stop", tools=TOOLS)
        assert (turn.reasoning, turn.content, turn.malformed) == (reasoning, content, [])
        got = [c.arguments for c in turn.tool_calls]
        # JSON: the model's exact text, compact or spaced, escaped or not; XML: typed values, written once
        assert got == (json_args if family == "qwen3" else [json.dumps(a, ensure_ascii=False) for a in calls])
