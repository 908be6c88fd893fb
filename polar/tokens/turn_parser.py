"""The part of every family's parser: sampled text → assistant message (content, reasoning, tool calls).

In token-faithful mode polar sends vLLM token ids, so vLLM's own reasoning and tool parsers never
run: polar does their job on the decoded sample. Every family shares the reasoning split and the
scan for tool-call blocks (`TurnParser`); a family (polar/tokens/formats/) only says how its blocks
are delimited and how to read one, and parsers.py registers it.

Nothing the model wrote is lost. A tool call that cannot be read (bad JSON, an unknown function,
a missing closing tag, a generation cut by the length limit) stays in `content` as the raw text,
and `malformed` says what was wrong with it. The parsers never raise on model output.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from polar.canonical import Tool, ToolCall

THINK_START, THINK_END = "<think>", "</think>"
_SNIPPET = 120


@dataclass
class ParsedTurn:
    content: str
    reasoning: str | None  # None: no reasoning block at all; "": an empty one
    tool_calls: list[ToolCall] = field(default_factory=list)
    truncated: bool = False  # the generation hit its length limit
    malformed: list[str] = field(default_factory=list)  # one line per problem; the raw text stays in content


class Malformed(Exception):
    """A tool-call block that cannot be read; the message is the reason."""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class TurnParser:
    """The shared part, and the family with no tool-call syntax (`plain`)."""

    name = "plain"
    call_start: str | None = None
    call_end: str | None = None
    # End-of-turn markers a caller may leave at the end of the decoded sample.
    stop_texts: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")

    def parse(self, text: str, *, think_open: bool, finish_reason: str, tools: list[Any]) -> ParsedTurn:
        truncated = finish_reason == "length"
        text = self._without_stop_text(text)
        reasoning, rest, closed = _split_reasoning(text, think_open)
        turn = ParsedTurn(content="", reasoning=reasoning, truncated=truncated)
        if not closed and not truncated:
            turn.malformed.append(f"the turn ended inside the reasoning block (no {THINK_END})")
        if self.call_start and self.call_end:
            self._split_calls(rest, tool_schemas(tools), turn)
        else:
            turn.content = rest
        return turn

    def read_call(self, body: str, schemas: dict[str, dict]) -> tuple[str, str]:
        """One block's inside → (function name, arguments as JSON text); raise Malformed otherwise."""
        raise NotImplementedError

    def read_calls(self, body: str, schemas: dict[str, dict]) -> list[tuple[str, str]]:
        """One block's inside → its calls: one, unless the family's block holds several (a section of calls)."""
        return [self.read_call(body, schemas)]

    def _without_stop_text(self, text: str) -> str:
        for stop in self.stop_texts:
            if text.endswith(stop):
                return text[: -len(stop)]
        return text

    def _split_calls(self, text: str, schemas: dict[str, dict], turn: ParsedTurn) -> None:
        """Fill turn.tool_calls; text outside good calls (and bad calls, raw) becomes content."""
        start_tag, end_tag = self.call_start, self.call_end
        assert start_tag and end_tag
        runs = [""]  # the text between well-formed calls
        pos = 0
        while (start := text.find(start_tag, pos)) >= 0:
            runs[-1] += text[pos:start]
            inner = start + len(start_tag)
            end = text.find(end_tag, inner)
            following = text.find(start_tag, inner)
            if end < 0 or 0 <= following < end:
                stop = following if following >= 0 else len(text)
                why = (
                    "unfinished tool call (the generation hit its length limit)"
                    if turn.truncated and following < 0
                    else f"a {start_tag} block is never closed"
                )
                self._reject(turn, why, text[start:stop], runs)
                pos = stop
                continue
            pos = end + len(end_tag)
            try:
                calls = self.read_calls(text[inner:end], schemas)
            except Malformed as exc:
                self._reject(turn, str(exc), text[start:pos], runs)
                continue
            turn.tool_calls.extend(ToolCall(id=new_call_id(), name=name, arguments=args) for name, args in calls)
            runs.append("")
        runs[-1] += text[pos:]
        turn.content = _join_runs(runs)

    @staticmethod
    def _reject(turn: ParsedTurn, reason: str, raw: str, runs: list[str]) -> None:
        snippet = raw if len(raw) <= _SNIPPET else raw[:_SNIPPET] + "…"
        turn.malformed.append(f"{reason}: {snippet!r}")
        runs[-1] += raw


def tool_schemas(tools: list[Any]) -> dict[str, dict]:
    """Function name → parameters schema, from canonical Tools or OpenAI-style tool dicts."""
    out: dict[str, dict] = {}
    for tool in tools or []:
        if isinstance(tool, Tool):
            out[tool.name] = tool.parameters
            continue
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


def typed_value(text: str, schema: Any) -> Any:
    """A parameter's text as the value its schema asks for; strings, unknown and untyped stay text."""
    types = _schema_types(schema)
    if not types or "string" in types:
        return text
    if "boolean" in types and text.strip() in ("True", "False"):  # Python-style, as some templates write them
        return text.strip() == "True"
    try:
        return json.loads(text, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return text


# -- helpers ------------------------------------------------------------------------------------

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


def _split_reasoning(text: str, think_open: bool) -> tuple[str | None, str, bool]:
    """(reasoning, the rest, whether the reasoning block was closed)."""
    if not think_open:
        lead = text.lstrip()
        if not lead.startswith(THINK_START):
            return None, text, True
        text = lead[len(THINK_START) :]
    end = text.find(THINK_END)
    if end < 0:
        return text.strip("\n"), "", False
    return text[:end].strip("\n"), text[end + len(THINK_END) :].lstrip("\n"), True


def _join_runs(runs: list[str]) -> str:
    """Content around well-formed calls: whitespace touching a call is template glue, not content."""
    if len(runs) == 1:
        return runs[0]
    parts = [runs[0].rstrip(), *(r.strip() for r in runs[1:-1]), runs[-1].lstrip()]
    return "\n\n".join(p for p in parts if p)


def member_texts(text: str) -> dict[str, str]:
    """Top-level member name → its value's exact source text, for a valid JSON object `text`."""
    out: dict[str, str] = {}
    i = _skip_ws(text, 1)
    while text[i] != "}":
        key, i = _DECODER.raw_decode(text, i)
        i = _skip_ws(text, _skip_ws(text, i) + 1)  # past the colon
        _, end = _DECODER.raw_decode(text, i)
        out[key] = text[i:end]
        i = _skip_ws(text, end)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
    return out


def _skip_ws(text: str, i: int) -> int:
    while text[i] in _WS:
        i += 1
    return i


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_known(name: str, schemas: dict[str, dict]) -> None:
    if name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        raise Malformed(f"unknown function {name!r} (tools offered: {known})")


def schema_properties(schema: Any) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _schema_types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    declared = schema.get("type")
    types = {declared} if isinstance(declared, str) else {t for t in declared or [] if isinstance(t, str)}
    for key in ("anyOf", "oneOf"):
        for member in schema.get(key) or []:
            types |= _schema_types(member)
    return types


def unpad(value: str) -> str:
    """Drop the one newline the format puts on each side of a value."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value
