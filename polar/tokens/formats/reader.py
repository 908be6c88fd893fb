"""The families whose turn polar reads with a reader of its own (gpt-oss's harmony messages, Mistral's trailing
`[TOOL_CALLS]` section) rather than the shared `<think>` split and call-block scan: the reader is fed the sample in
pieces and says what each settles, so the whole-answer parse (one piece) and the stream (stream_parse, many) are
one code path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from polar.canonical import ToolCall
from polar.tokens.turn_parser import ParsedTurn, TurnParser, new_call_id

# What a reader hands on: ("reasoning" | "content", text) or ("call", (name, arguments[, the model's own call id])).
Emit = Callable[[str, Any], None]


class Reader(Protocol):
    malformed: list[str]

    def feed(self, text: str) -> None: ...

    def finish(self, truncated: bool) -> None: ...


class ReaderParser(TurnParser):
    def reader(self, tools: list, emit: Emit) -> Reader:
        raise NotImplementedError

    def parse(self, text: str, *, think_open: bool, finish_reason: str, tools: list) -> ParsedTurn:
        turn = ParsedTurn(content="", reasoning=None, truncated=finish_reason == "length")
        parts: dict[str, list[str]] = {"reasoning": [], "content": []}

        def emit(kind: str, payload: Any) -> None:
            if kind == "call":
                turn.tool_calls.append(ToolCall(id=call_id(payload), name=payload[0], arguments=payload[1]))
            else:
                parts[kind].append(payload)

        reader = self.reader(tools, emit)
        reader.feed(self._without_stop_text(text))
        reader.finish(turn.truncated)
        turn.content = "".join(parts["content"])
        turn.reasoning = "".join(parts["reasoning"]) if parts["reasoning"] else None
        turn.malformed = reader.malformed
        return turn


def call_id(payload: tuple) -> str:
    """The id the model wrote for its call (Mistral-Small-3.2's `[CALL_ID]`: its tool result must name it), else
    polar's own."""
    return payload[2] if len(payload) > 2 and payload[2] else new_call_id()
