"""MiniMax-M2 (vLLM's `minimax_m2`): `<minimax:tool_call>` holding one or more
`<invoke name="N"><parameter name="K">V</parameter></invoke>`; a value is text, typed by the tool's schema."""

from __future__ import annotations

from polar.tokens.formats.markup import Invokes
from polar.tokens.turn_parser import TurnParser


class MiniMaxM2Parser(TurnParser):
    name = "minimax_m2"
    call_start, call_end = "<minimax:tool_call>", "</minimax:tool_call>"
    stop_texts = ("[e~[",)
    _invokes = Invokes()

    def read_calls(self, body: str, schemas: dict[str, dict]) -> list[tuple[str, str]]:
        return self._invokes.read(body, schemas)
