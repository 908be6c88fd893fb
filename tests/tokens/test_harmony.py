"""gpt-oss's harmony turns: what vLLM's HarmonyParser drops, polar keeps raw and names (the agreement with vLLM on
the real template's turns is tests/tokens/test_vllm_parser_agreement.py)."""

from polar.tokens.parsers import parse_turn
from tests.tokens.parser_corpus import TOOLS

BROWSER = "<|start|>assistant<|channel|>commentary to=browser.search <|constrain|>json<|message|>{\"q\": \"x\"}<|call|>"


def test_a_message_to_no_function_stays_raw_and_is_named():
    turn = parse_turn("<|channel|>analysis<|message|>look<|end|>" + BROWSER, "harmony", think_open=False,
                      finish_reason="stop", tools=TOOLS)
    assert (turn.reasoning, turn.tool_calls) == ("look", [])
    assert turn.content == BROWSER.removesuffix("<|call|>")
    assert "to no function" in turn.malformed[0]


def test_unknown_function_and_bad_json_are_not_calls():
    text = ("<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}<|call|>"
            "<|start|>assistant to=functions.list_dir<|channel|>commentary json<|message|>{oops}<|call|>"
            "<|start|>assistant<|channel|>final<|message|>done<|return|>")
    turn = parse_turn(text, "harmony", think_open=False, finish_reason="stop", tools=TOOLS)
    assert turn.tool_calls == [] and turn.reasoning is None
    assert "unknown function 'nope'" in turn.malformed[0] and "not valid JSON" in turn.malformed[1]
    assert turn.content.endswith("\ndone") and "{oops}" in turn.content


def test_plain_text_is_content_named_as_no_harmony():
    turn = parse_turn("just words", "harmony", think_open=False, finish_reason="stop", tools=TOOLS)
    assert turn.content == "just words" and "unfinished message header" in turn.malformed[0]
