"""How the served model family writes a turn, and how vLLM's parsers read it back.

The double's answers must look like what the model behind the gateway's template would sample,
or a test on a real template measures the double instead of polar. Qwen's two families here (the templates in
../shared/reference/templates and polar/tokens/parsers.py agree on them), the others in family_writers.py:

- Qwen3 / Qwen2.5 (`qwen3`, vLLM's `hermes` parser): `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`,
  one more "\\n" before each call after content or another call.
- Qwen3.5 / Qwen3-Coder (`qwen3_xml`): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n…`,
  "\\n\\n" before the first call after content, "\\n" between calls.

Reasoning follows the generation prompt: after an open `<think>\\n` (Qwen3.5) the model writes the
reasoning and closes it; after `</think>\\n\\n` (thinking switched off) it writes none; after a bare
assistant header a template that knows `<think>` (Qwen3 hybrid) gets the whole block from the
model, and one that does not (Qwen3-Coder) gets no reasoning at all. Each is exactly how the
template re-renders the turn, so the double never breaks a prefix the template itself keeps.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from polar.doubles.family_writers import WRITERS, turns_sampled, with_call_ids, writer_for
from polar.doubles.script import ASSISTANT_OPEN, Step
from polar.tokens.families import detect
from polar.tokens.parsers import family_for_template, parse_turn

# The families whose turns this double writes: Qwen's here (deltas.py streams them as vLLM does), the others in
# family_writers.py (streamed chat deltas are Qwen's only; token-in endpoints stream any family).
WRITES = ("qwen3", "qwen3_xml", *WRITERS)

THINK_OPEN, THINK_CLOSE = "<think>\n", "</think>\n\n"
# open: the prompt opened the block; own: the model writes it; none: no reasoning this turn
Reasoning = Literal["open", "own", "none"]


@dataclass(frozen=True)
class ModelFormat:
    family: str  # polar's parser name: "qwen3" (JSON tool calls), "qwen3_xml", or one of family_writers.WRITERS
    knows_think: bool  # the template renders reasoning blocks at all

    @classmethod
    def for_template(cls, template_text: str) -> ModelFormat:
        """The format of the template's model family; ValueError for a family the double cannot write (it would
        answer in another family's syntax, which the template's own parser would not read)."""
        family = family_for_template(template_text)
        known = detect(template_text)
        if known is not None and known.name in WRITERS:  # a writer per template, where a family's templates differ
            family = known.name
        family = writer_for(family, template_text)  # a family's templates whose models write differently
        if family == "plain" and known is None:
            family = "qwen3"  # a template with no tool syntax at all (the tests' toys): Qwen's JSON, as before
        if family not in WRITES:
            raise ValueError(f"the scripted double writes {', '.join(WRITES)} answers only; this template is "
                             f"{known.name if known else family} (polar/doubles/model_format.py)")
        return cls(family, "<think>" in template_text)

    @property
    def streams_chat(self) -> bool:
        """Whether deltas.py can cut this family's streamed chat answers as vLLM's parsers do."""
        return self.family not in WRITERS

    @property
    def end_of_turn(self) -> str:
        """The stop token the model samples after its turn (an answer's, where a family stops calls otherwise)."""
        return WRITERS[self.family].end_of_turn if self.family in WRITERS else "<|im_end|>"

    def stop_token(self, step: Step) -> str:
        """The stop token the model samples after this step's turn."""
        return WRITERS[self.family].stop(step) if self.family in WRITERS else "<|im_end|>"

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        writer = WRITERS.get(self.family)
        return (writer.end_of_turn, *([writer.call_end] if writer.call_end else [])) if writer else ("<|im_end|>",)

    def turn(self, prompt_text: str) -> int:
        """How many assistant turns the prompt already holds (which step of the script answers)."""
        if self.family in WRITERS:
            return turns_sampled(WRITERS[self.family], prompt_text)
        return max(prompt_text.count(ASSISTANT_OPEN) - 1, 0)

    def reasoning_mode(self, prompt_text: str) -> Reasoning:
        if self.family in WRITERS:
            opened = WRITERS[self.family].think_open
            return "open" if opened and prompt_text.endswith(opened) else "none"
        if prompt_text.endswith(THINK_OPEN):
            return "open"
        if prompt_text.endswith(THINK_CLOSE) or not self.knows_think:
            return "none"
        return "own"

    def completion(self, step: Step, prompt_text: str) -> str:
        """The text the model would sample after this prompt, without the stop token."""
        mode = self.reasoning_mode(prompt_text)
        if self.family in WRITERS:
            writer = WRITERS[self.family]
            step = with_call_ids(step, prompt_text) if writer.call_ids else step
            if mode == "open":
                return (step.reasoning or "").strip("\n") + writer.think_close + writer.write(step, prompt_text)
            return writer.reasoning(step, prompt_text) + writer.write(step, prompt_text)
        out = ""
        if mode != "none":
            out += ("<think>\n" if mode == "own" else "") + (step.reasoning or "").strip("\n") + "\n</think>\n\n"
        out += step.content
        for i, call in enumerate(step.tool_calls):
            out += self._separator(i, step.content) + self._call(call)
        return out

    def parse(self, text: str, prompt_text: str, tools: list[dict[str, Any]]) -> tuple[str | None, str, list[dict]]:
        """Split sampled text as vLLM's reasoning parser and this family's tool parser would (outside Qwen, polar's
        own parser stands in for vLLM's: reasoning and content come without the template's glue)."""
        if self.family in WRITERS:
            turn = parse_turn(text, WRITERS[self.family].parser or self.family, think_open=self.reasoning_mode(prompt_text) == "open",
                              finish_reason="stop", tools=tools)
            calls = [{"name": c.name, "arguments": c.arguments} for c in turn.tool_calls]
            return turn.reasoning, turn.content, calls
        return parse_completion(text, self.reasoning_mode(prompt_text) != "none", tools, self.family)

    def _separator(self, index: int, content: str) -> str:
        if index:
            return "\n"
        if self.family == "qwen3_xml":
            return "\n\n" if content.strip() else ""
        return "\n" if content else ""

    def _call(self, call: dict[str, Any]) -> str:
        args = call.get("arguments") or {}
        if self.family == "qwen3_xml":
            if isinstance(args, str):
                args = json.loads(args) if args.strip() else {}
            out = "<tool_call>\n<function=" + call["name"] + ">\n"
            for key, value in args.items():
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                out += f"<parameter={key}>\n{text}\n</parameter>\n"
            return out + "</function>\n</tool_call>"
        # JSON: a string is arguments the model wrote itself (compact, say); kept as written
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return '<tool_call>\n{"name": "' + call["name"] + '", "arguments": ' + text + "}\n</tool_call>"


_XML_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\n?(.*?)</function>\s*</tool_call>", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_JSON_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_completion(
    text: str, thinking: bool, tools: list[dict[str, Any]], family: str = "qwen3_xml"
) -> tuple[str | None, str, list[dict]]:
    """(reasoning, content, calls as {"name", "arguments" JSON text}) from sampled text, as vLLM 0.32's whole-answer
    parse gives them: the newlines around </think> stay (in reasoning and content alike); the text before XML tool
    calls is stripped, before hermes (JSON) calls it stays as written unless it is only whitespace
    (tests/doubles/test_deltas_vs_vllm.py checks it on whole answers; a sample cut inside a call or a character is
    not emulated: vLLM makes a call of a half-written one and holds a half-decoded character back)."""
    reasoning = None
    if thinking:
        if "</think>" in text:
            reasoning, text = text.split("</think>", 1)
        else:  # truncated inside the reasoning
            reasoning, text = text, ""
        reasoning = reasoning.removeprefix("<think>")
    calls = _json_calls(text) if family == "qwen3" else _xml_calls(text, tools)
    content = text
    if calls:
        content = text[: text.index("<tool_call>")]
        content = content.strip() if family == "qwen3_xml" or not content.strip() else content
    return reasoning, content, calls


def _xml_calls(text: str, tools: list[dict[str, Any]]) -> list[dict]:
    calls = []
    for m in _XML_CALL.finditer(text):
        name = m.group(1).strip()
        schema = next((t["function"].get("parameters", {}) for t in tools if t.get("function", {}).get("name") == name), {})
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        args = {k.strip(): _typed(v, props.get(k.strip(), {})) for k, v in _PARAM.findall(m.group(2))}
        calls.append({"name": name, "arguments": json.dumps(args, ensure_ascii=False)})
    return calls


def _json_calls(text: str) -> list[dict]:
    """hermes: each block is a JSON object; vLLM re-serialises its arguments with json.dumps."""
    calls = []
    for m in _JSON_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            calls.append({"name": obj["name"], "arguments": json.dumps(obj.get("arguments") or {}, ensure_ascii=False)})
    return calls


def _typed(value: str, schema: dict) -> Any:
    """Parameter text → JSON value, guided by the tool schema (strings stay strings)."""
    if schema.get("type") == "string":
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def render_completion(step: Step, thinking: bool, family: str = "qwen3_xml") -> str:
    """The sample after a Qwen3.5-style prompt (an open think block when `thinking`): kept for older callers."""
    fmt = ModelFormat(family, True)
    return fmt.completion(step, THINK_OPEN if thinking else THINK_CLOSE)
