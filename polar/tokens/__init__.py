"""Token-faithful prompts: the model's chat template and tokenizer, and parsers for what it samples."""

from polar.tokens.parsers import PARSERS, ParsedTurn, family_for_template, parse_turn
from polar.tokens.shaping import TemplateTraits, shape
from polar.tokens.template import ChatTemplate, Continuation

__all__ = [
    "PARSERS",
    "ChatTemplate",
    "Continuation",
    "ParsedTurn",
    "TemplateTraits",
    "family_for_template",
    "parse_turn",
    "shape",
]
