"""Mistral's `[TOOL_CALLS]` section beyond what the corpus covers (tests/tokens/test_vllm_parser_agreement.py holds
the agreement with vLLM's `mistral` parser on Devstral's real template and the older JSON-list calls)."""

from polar.tokens.parsers import parse_turn
from tests.tokens.parser_corpus import TOOLS


def parse(text, finish_reason="stop"):
    return parse_turn(text, "mistral", think_open=False, finish_reason=finish_reason, tools=TOOLS)


def test_call_ids_as_mistral_small_writes_them():
    turn = parse('[TOOL_CALLS]get_weather[CALL_ID]call1abcd[ARGS]{"city": "Paris"}[TOOL_CALLS]list_dir[CALL_ID]'
                 "call2abcd[ARGS]{}</s>")
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("get_weather", '{"city": "Paris"}'), ("list_dir", "{}")]
    assert (turn.content, turn.malformed) == ("", [])


def test_a_bad_section_stays_raw_whole_and_is_named():
    text = 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]nope[ARGS]{}'
    turn = parse(text)
    assert turn.tool_calls == [] and turn.content == text and "unknown function 'nope'" in turn.malformed[0]
    cut = parse('[TOOL_CALLS][{"name": "list_dir", "argu', finish_reason="length")
    assert cut.tool_calls == [] and "length limit" in cut.malformed[0]
