"""Kimi-K2 (vLLM's `kimi_k2`): `<|tool_calls_section_begin|>` holding one or more
`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>`."""

from __future__ import annotations

import re

from polar.tokens.formats.markup import json_arguments
from polar.tokens.turn_parser import Malformed, TurnParser, check_known


class KimiK2Parser(TurnParser):
    name = "kimi_k2"
    call_start, call_end = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    stop_texts = ("<|im_end|>",)
    _call = re.compile(r"\s*<\|tool_call_begin\|>\s*(?:functions\.)?([^\s<]+?):\d+\s*"
                       r"<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>\s*", re.S)

    def read_calls(self, body: str, schemas: dict[str, dict]) -> list[tuple[str, str]]:
        calls, pos = [], 0
        while m := self._call.match(body, pos):
            check_known(m.group(1), schemas)
            calls.append((m.group(1), json_arguments(m.group(2))))
            pos = m.end()
        if pos < len(body) or not calls:
            raise Malformed("a call of the tool-call section does not read as "
                            "<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>")
        return calls
