"""The scripted double writes Mistral's turns as Devstral-Small-2507's and Mistral-Small-3.2's real templates render
them, on Mistral's vocabulary (mistral-common's tekken, `[ARGS]`/`[CALL_ID]` stand-ins: tests/support/tekken_vocab.py):
read by polar's parser, a sample is the scripted answer, the template renders it back as exactly the sample and its
`</s>`, and vLLM's own `mistral` parser, run on the same vocabulary, reads the same calls and text."""

from __future__ import annotations

import json
import re

import pytest

from polar.doubles.family_writers import WRITERS
from polar.doubles.scripted_vllm import ModelFormat, Step
from polar.tokens.parsers import parse_turn
from polar.tokens.template import ChatTemplate
from tests.conftest import family_template
from tests.support.tekken_vocab import tekken_vocab_dir
from tests.tokens.parser_corpus import SPECIAL_TOKENS, Sample
from tests.tokens.test_double_format import CONVERSATION, TOOLS
from tests.tokens.test_vllm_parser_agreement import polar_view, vllm_results, vllm_view

NESTED = {"cmd": "cat «données/日本.txt» | grep 'é\"q'", "timeout": 5}
STEPS = {
    "one-call": Step(content="", tool_calls=[{"name": "run", "arguments": {"cmd": "pytest -q", "timeout": 60}}]),
    "parallel": Step(content="Checking both.", tool_calls=[{"name": "run", "arguments": {"cmd": "ls"}},
                                                           {"name": "run", "arguments": {"cmd": "pwd", "timeout": 5}}]),
    "non-ascii": Step(content="", tool_calls=[{"name": "run", "arguments": NESTED}]),
    "empty-arguments": Step(content="", tool_calls=[{"name": "run", "arguments": {}}]),
    "answer": Step(content="Tout va bien ✓ — 修复了.\n\nTwo paragraphs."),
}
LABELS = {"devstral": "mistral", "mistral-small-3.2": "mistral-call-id"}


def steps_for(label: str) -> dict[str, Step]:
    """Mistral-Small-3.2's template drops text beside calls: its model's turn is text or calls."""
    if LABELS[label] == "mistral":
        return STEPS
    return {name: Step(s.reasoning, "" if s.tool_calls else s.content, s.tool_calls) for name, s in STEPS.items()}


@pytest.fixture(scope="module")
def mistral():
    made: dict[str, tuple[ChatTemplate, ModelFormat]] = {}

    def get(label: str) -> tuple[ChatTemplate, ModelFormat]:
        if label not in made:
            ct = ChatTemplate.from_dir(tekken_vocab_dir(), family_template(label))
            made[label] = ct, ModelFormat.for_template(ct.template_text)
        return made[label]

    return get


def sampled(label: str, mistral) -> list[tuple[str, str, Step]]:
    """(name, sampled text, step) per step, after the conversation's prompt."""
    ct, fmt = mistral(label)
    prompt = ct.render(CONVERSATION, TOOLS, True)
    return [(name, fmt.completion(step, prompt), step) for name, step in steps_for(label).items()]


@pytest.mark.parametrize("label", LABELS)
def test_sample_parses_and_renders_back(mistral, label):
    ct, fmt = mistral(label)
    assert fmt.family == LABELS[label] and fmt.end_of_turn == ct.end_of_turn == "</s>"
    assert ct.generation_prompt(None) == "" and not fmt.knows_think  # the turn follows [/INST]; no reasoning
    prompt = ct.render(CONVERSATION, TOOLS, True)
    for name, sample, step in sampled(label, mistral):
        turn = parse_turn(sample + "</s>", "mistral", think_open=False, finish_reason="stop", tools=TOOLS)
        assert not turn.malformed, (name, turn.malformed)
        assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
            (c["name"], c["arguments"]) for c in step.tool_calls], name
        assert turn.content == step.content and turn.reasoning is None, name
        ids = [c.id for c in turn.tool_calls]
        if WRITERS[fmt.family].call_ids:  # the model's own ids, as the template takes them
            assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids) and len(set(ids)) == len(ids), (name, ids)
        message = {"role": "assistant", "content": turn.content, "tool_calls": [
            {"id": i or f"call{n}xyz", "type": "function",
             "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
            for n, (i, c) in enumerate(zip(ids, turn.tool_calls, strict=True))]}
        assert ct.render([*CONVERSATION, message], TOOLS, False) == prompt + sample + "</s>", name
        encoded = ct.encode(sample + "</s>")
        assert encoded[-1] == ct.end_of_turn_id == 2 and ct.decode(encoded) == sample + "</s>", name
    assert fmt.parse(sampled(label, mistral)[1][1], prompt, TOOLS)[2] == [
        {"name": "run", "arguments": '{"cmd": "ls"}'}, {"name": "run", "arguments": '{"cmd": "pwd", "timeout": 5}'}]


def test_call_ids_differ_turn_to_turn(mistral):
    """The ids Mistral-Small-3.2's model writes: one per call, new on every turn (made from the prompt), the same for
    the same prompt; an id the script gives is kept."""
    ct, fmt = mistral("mistral-small-3.2")
    step = STEPS["one-call"]
    first = ct.render(CONVERSATION, TOOLS, True)
    later = first + fmt.completion(step, first) + "</s>[TOOL_RESULTS]x[TOOL_CONTENT]ok[/TOOL_RESULTS]"
    ids = [re.findall(r"\[CALL_ID\](\w+)\[ARGS\]", fmt.completion(step, p)) for p in (first, later, first)]
    assert ids[0] != ids[1] and ids[0] == ids[2] and all(len(i) == 1 for i in ids)
    given = Step(content="", tool_calls=[{**step.tool_calls[0], "id": "Ab3dE5gH9"}])
    assert "[CALL_ID]Ab3dE5gH9[ARGS]" in fmt.completion(given, first)


@pytest.mark.vllm
def test_vllm_mistral_parser_reads_what_the_double_writes(mistral, tmp_path_factory):
    """vLLM's own `mistral` parser (the oracle, scripts/vllm_parser_oracle.py) on the same tekken vocabulary reads the
    same calls and text as polar's. One listed difference (docs/templates.md): vLLM 0.32's parser knows no `[CALL_ID]`,
    so it names Mistral-Small-3.2's calls `NAME[CALL_ID]ID` (no tool of that name) where polar reads the name and hands
    the model's id on."""
    corpus = [Sample(f"double/{label}/{name}", label, "mistral", "mistral", "", SPECIAL_TOKENS["mistral"], False,
                     "stop", text, [[c["name"], c["arguments"]] for c in step.tool_calls], TOOLS, {})
              for label in LABELS for name, text, step in sampled(label, mistral)]
    oracle = vllm_results(corpus, tekken_vocab_dir(), tmp_path_factory.mktemp("oracle"), "vllm-mistral-double")
    for sample in corpus:
        turn, mine = polar_view(sample)
        assert not turn.malformed and mine["calls"] == sample.expected_calls, sample.id
        if sample.label == "mistral-small-3.2":
            mine["calls"] = [[f"{c.name}[CALL_ID]{c.id}", args] for c, (_, args) in zip(turn.tool_calls, mine["calls"],
                                                                                       strict=True)]
        assert mine == vllm_view(oracle[sample.id]), sample.id
