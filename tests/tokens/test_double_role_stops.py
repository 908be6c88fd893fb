"""The scripted double's GLM-4.6, GLM-4.7 and gpt-oss (harmony) turns, held to the real templates and polar's parsers
(stand-in vocabularies: Qwen3.5's plus each family's special tokens). These families stop a tool-calling turn with
another token than an answer (GLM: the next turn's role token, `<|observation|>` or `<|user|>`; harmony: `<|call|>`
or `<|return|>`), and the double samples the right one."""

from __future__ import annotations

import json

import pytest

from polar.doubles.model_format import ModelFormat
from polar.tokens.parsers import parse_turn
from polar.tokens.template import ChatTemplate
from tests.conftest import family_template
from tests.support.stand_in import END_TOKENS, stand_in_tokenizer
from tests.tokens.test_double_format import CONVERSATION, STEPS, TOOLS

LABELS = {"glm-4.6": "glm45", "glm-4.7": "glm45", "gpt-oss": "harmony"}
# What stops each step's turn: a call, then an answer.
STOPS = {"glm45": ("<|observation|>", "<|user|>"), "harmony": ("<|call|>", "<|return|>")}
RESULT = {"role": "tool", "tool_call_id": "c0", "content": "ok"}


@pytest.fixture(scope="module")
def formats(tokenizer_dir):
    made = {}

    def get(label):
        if label not in made:
            text, family = family_template(label).read_text(), LABELS[label]
            tok = stand_in_tokenizer(tokenizer_dir, family)
            made[label] = ChatTemplate(tok, text, eos_token_ids=[tok.convert_tokens_to_ids(t) for t in END_TOKENS[family]],
                                       name=label), ModelFormat.for_template(text)
        return made[label]

    return get


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("step", range(len(STEPS)))
@pytest.mark.parametrize("label", list(LABELS))
def test_sample_parses_and_renders_back(formats, label, step, thinking):
    ct, fmt = formats(label)
    step = STEPS[step]
    family = LABELS[label]
    prompt = ct.render(CONVERSATION, TOOLS, True, thinking)
    stop = fmt.stop_token(step)
    assert stop == STOPS[family][0 if step.tool_calls else 1]
    sample = fmt.completion(step, prompt)
    turn = parse_turn(sample + stop, family, think_open=ct.prompt_opens_think(ct.encode(prompt), thinking),
                      finish_reason="stop", tools=TOOLS)
    calls = step.tool_calls[:1] if family == "harmony" else step.tool_calls  # gpt-oss stops at its first <|call|>
    assert not turn.malformed
    assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [(c["name"], c["arguments"]) for c in calls]
    assert turn.content.strip("\n") == step.content  # GLM-4.6's newline before the text, as vLLM's glm45 keeps it
    writes_reasoning = thinking or family == "harmony"  # the script's reasoning; gpt-oss always has its analysis
    assert turn.reasoning == (step.reasoning if writes_reasoning else None)
    if family == "harmony" and step.tool_calls and step.content:
        return  # text beside a call is a commentary preamble: the template writes it as the analysis (none of both)
    message = {"role": "assistant", "content": turn.content, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
        for i, c in enumerate(turn.tool_calls)]}
    if turn.reasoning is not None:
        message["reasoning_content"] = turn.reasoning
    if family == "glm45":  # the template writes nothing after the turn: the next message's role token is the stop
        assert ct.render([*CONVERSATION, message], TOOLS, False, thinking) == prompt + sample
        after = [RESULT] if step.tool_calls else [{"role": "user", "content": "next"}]
        whole = ct.render([*CONVERSATION, message, *after], TOOLS, True, thinking)
        if not step.tool_calls:  # a user message drops the turn's reasoning from a render (GLM's history rule)
            prompt, sample = "", sample[sample.rfind("</think>") + len("</think>") :]
    else:
        whole = ct.render([*CONVERSATION, message], TOOLS, False, thinking)
    assert (prompt + sample + stop) in whole and whole.startswith(prompt), (whole[len(prompt) :], sample)
    ids = ct.encode(sample + stop)
    assert ct.decode(ids) == sample + stop and ids[-1] == ct.tokenizer.convert_tokens_to_ids(stop)
