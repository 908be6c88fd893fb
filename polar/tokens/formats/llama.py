"""Llama 3.1 / 3.2 / 3.3 (vLLM's `llama3_json`): a tool call is the whole answer, a JSON object
`{"name": NAME, "parameters": {...}}` (or `"arguments"`), optionally after `<|python_tag|>`, several separated by `;`.

The template teaches the whole answer to be the call, so polar reads calls only when the answer is nothing but
them; vLLM's parser takes any `{…}` with a "name" anywhere in the text and drops the text around it.
"""

from __future__ import annotations

import json

from polar.canonical import ToolCall
from polar.tokens.turn_parser import (
    Malformed,
    ParsedTurn,
    TurnParser,
    check_known,
    member_texts,
    new_call_id,
    reject_constant,
    tool_schemas,
)

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3JsonParser(TurnParser):
    name = "llama3_json"
    stop_texts = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
    whole_answer = True  # stream_parse: hold an answer that may be calls until it ends

    @staticmethod
    def may_be_calls(text: str) -> bool:
        """Could an answer that starts so still be calls (the stream holds it back while it could)?"""
        lead = text.lstrip()
        return not lead or lead.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(lead)

    def parse(self, text: str, *, think_open: bool, finish_reason: str, tools: list) -> ParsedTurn:
        turn = super().parse(text, think_open=think_open, finish_reason=finish_reason, tools=tools)
        body = turn.content.strip()
        tagged = body.startswith(PYTHON_TAG)
        if not (tagged or body.startswith("{")):
            return turn
        try:
            calls = self.read_calls(body.removeprefix(PYTHON_TAG).lstrip(), tool_schemas(tools))
        except Malformed as exc:
            if tagged or turn.truncated:  # a call was meant; the raw text stays the content
                why = "unfinished tool call (the generation hit its length limit)" if turn.truncated else str(exc)
                turn.malformed.append(f"{why}: {body[:120]!r}")
            return turn
        turn.tool_calls = [ToolCall(id=new_call_id(), name=name, arguments=args) for name, args in calls]
        turn.content = ""
        return turn

    def read_calls(self, body: str, schemas: dict[str, dict]) -> list[tuple[str, str]]:
        calls, i = [], 0
        while True:
            try:
                obj, end = _DECODER.raw_decode(body, i)
            except (ValueError, RecursionError) as exc:
                raise Malformed(f"the tool call is not valid JSON ({exc})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise Malformed('the answer is a JSON value with no "name": not a tool call')
            key = "parameters" if "parameters" in obj else "arguments"
            if not isinstance(obj.get(key, {}), dict):
                raise Malformed(f'"{key}" is not a JSON object')
            check_known(obj["name"], schemas)
            json.loads(body[i:end], parse_constant=reject_constant)  # NaN and friends are not JSON
            calls.append((obj["name"], member_texts(body[i:end]).get(key, "{}")))
            i = end + (len(body[end:]) - len(body[end:].lstrip()))
            if i == len(body):
                return calls
            if body[i] != ";":
                raise Malformed("text after the tool call")
            i += 1
            i += len(body[i:]) - len(body[i:].lstrip())
