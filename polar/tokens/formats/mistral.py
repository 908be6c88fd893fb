"""Mistral and Devstral (vLLM's `mistral` tool parser): the calls end the answer, after `[TOOL_CALLS]`:

    TEXT[TOOL_CALLS]NAME[ARGS]{json}[TOOL_CALLS]NAME2[ARGS]{json}     (tokenizers v11 and later: Devstral)
    TEXT[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{json}                        (Mistral-Small-3.2's template)
    TEXT[TOOL_CALLS][{"name": NAME, "arguments": {...}}, ...]          (older tokenizers, no [ARGS] token)

Everything after the first `[TOOL_CALLS]` is one section: it is calls only if all of it reads well, else it stays
raw in the content and `malformed` says why. `MistralReader` reads the turn in pieces, so the whole parse and the
stream (stream_parse) are one code path: text streams until `[TOOL_CALLS]`, the section is settled at the end.
"""

from __future__ import annotations

import json

from polar.tokens.formats.markup import json_arguments
from polar.tokens.formats.reader import Emit, ReaderParser
from polar.tokens.turn_parser import (
    Malformed,
    check_known,
    member_texts,
    reject_constant,
    tool_schemas,
)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_DECODER = json.JSONDecoder()
_SNIPPET = 120


def read_section(section: str, schemas: dict[str, dict]) -> list[tuple[str, ...]]:
    """What follows the first [TOOL_CALLS] → its calls (name, arguments as written[, the call id the model wrote]),
    or Malformed."""
    if section.lstrip().startswith("["):
        return _json_list(section.strip(), schemas)
    calls = []
    for chunk in section.split(TOOL_CALLS):
        head, sep, args = chunk.partition(ARGS)
        name, _, call_id = (part.strip() for part in head.partition(CALL_ID))
        if not sep or not name:
            raise Malformed(f"a call is not NAME{ARGS}{{json}}")
        check_known(name, schemas)
        calls.append((name, json_arguments(args), call_id) if call_id else (name, json_arguments(args)))
    return calls


def _json_list(text: str, schemas: dict[str, dict]) -> list[tuple[str, str]]:
    try:
        items = json.loads(text, parse_constant=reject_constant)
    except (ValueError, RecursionError) as exc:
        raise Malformed(f"the tool calls are not valid JSON ({exc})") from None
    calls, i = [], 1
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise Malformed('a tool call with no "name"')
        check_known(item["name"], schemas)
        if not isinstance(item.get("arguments", {}), dict):
            raise Malformed('"arguments" is not a JSON object')
        i = len(text) - len(text[i:].lstrip(" \t\n\r,"))
        _, end = _DECODER.raw_decode(text, i)
        calls.append((item["name"], member_texts(text[i:end]).get("arguments", "{}")))
        i = end
    if not calls:
        raise Malformed("an empty list of tool calls")
    return calls


class MistralReader:
    """One sampled turn, fed in pieces split anywhere; `emit` gets ("content", text) or ("call", (name, args))."""

    def __init__(self, schemas: dict[str, dict], emit: Emit):
        self.schemas, self._emit = schemas, emit
        self.malformed: list[str] = []
        self._buf = ""  # a possible start of [TOOL_CALLS], or (once seen) the whole section
        self._section = False

    def feed(self, text: str) -> None:
        self._buf += text
        if self._section:
            return
        at = self._buf.find(TOOL_CALLS)
        if at >= 0:
            self._send(self._buf[:at])
            self._buf, self._section = self._buf[at + len(TOOL_CALLS) :], True
            return
        hold = self._buf.rfind("[")
        keep = hold if hold >= 0 and TOOL_CALLS.startswith(self._buf[hold:]) else len(self._buf)
        self._send(self._buf[:keep])
        self._buf = self._buf[keep:]

    def finish(self, truncated: bool) -> None:
        if not self._section:
            return self._send(self._buf)
        raw = TOOL_CALLS + self._buf
        try:
            if truncated:
                raise Malformed("unfinished tool call (the generation hit its length limit)")
            calls = read_section(self._buf, self.schemas)
        except Malformed as exc:
            self.malformed.append(f"{exc}: {raw if len(raw) <= _SNIPPET else raw[:_SNIPPET] + '…'!r}")
            return self._send(raw)
        for call in calls:
            self._emit("call", call)

    def _send(self, text: str) -> None:
        if text:
            self._emit("content", text)


class MistralParser(ReaderParser):
    name = "mistral"
    stop_texts = ("</s>",)

    def reader(self, tools: list, emit: Emit) -> MistralReader:
        return MistralReader(tool_schemas(tools), emit)
