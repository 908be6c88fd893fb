"""Sampled text → assistant message, per model family: the registry of the families' parsers.

The shared part (reasoning split, call-block scan, `ParsedTurn`) is in turn_parser.py; each family's
block syntax is a module under formats/. To add a family: subclass `TurnParser` there, register an
instance in `PARSERS` under the name families.py gives as its `parser`.
"""

from __future__ import annotations

from typing import Any

from polar.tokens.families import detect
from polar.tokens.formats.deepseek import DeepSeekDsmlParser, DeepSeekV4Parser, DeepSeekV31Parser
from polar.tokens.formats.glm import GlmParser
from polar.tokens.formats.harmony import HarmonyParser
from polar.tokens.formats.kimi import KimiK2Parser
from polar.tokens.formats.llama import Llama3JsonParser
from polar.tokens.formats.minimax import MiniMaxM2Parser
from polar.tokens.formats.mistral import MistralParser
from polar.tokens.formats.qwen import Qwen3JsonParser, Qwen3XmlParser
from polar.tokens.turn_parser import (
    THINK_END,
    THINK_START,
    Malformed,
    ParsedTurn,
    TurnParser,
    new_call_id,
    tool_schemas,
    typed_value,
)

__all__ = [
    "PARSERS", "THINK_END", "THINK_START", "Malformed", "ParsedTurn", "Qwen3JsonParser", "Qwen3XmlParser", "TurnParser",
    "family_for_template", "new_call_id", "parse_turn", "tool_schemas", "typed_value",
]  # fmt: skip

PARSERS: dict[str, TurnParser] = {
    "qwen3": Qwen3JsonParser(),
    "qwen3_xml": Qwen3XmlParser(),
    **{p.name: p for p in (GlmParser(), MiniMaxM2Parser(), DeepSeekV31Parser(), DeepSeekDsmlParser(), DeepSeekV4Parser(),
                           KimiK2Parser(), Llama3JsonParser(), HarmonyParser(),
                           MistralParser())},
    "plain": TurnParser(),
}


def parse_turn(text: str, family: str, *, think_open: bool, finish_reason: str, tools: list[Any]) -> ParsedTurn:
    """Parse one sampled assistant turn (the decoded sample, end-of-turn marker optional)."""
    try:
        parser = PARSERS[family]
    except KeyError:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(PARSERS)}") from None
    return parser.parse(text, think_open=think_open, finish_reason=finish_reason, tools=tools)


def family_for_template(template_text: str) -> str:
    """The parser for the output a chat template teaches its model (`plain`: polar has none for it; families.py
    says which family it is, and token-faithful mode refuses such a template)."""
    family = detect(template_text)
    return family.parser if family and family.parser else "plain"
