"""DeepSeek: V3.1 (vLLM's `deepseek_v31`) writes
`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
V3.2 and V4 (`deepseek_v32`, `deepseek_v4`) write DSML: `<｜DSML｜function_calls>` (V4: `tool_calls`) holding
`<｜DSML｜invoke name="N"><｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>…`."""

from __future__ import annotations

from polar.tokens.formats.markup import Invokes, json_arguments
from polar.tokens.turn_parser import Malformed, TurnParser, check_known

END_OF_SENTENCE = "<｜end▁of▁sentence｜>"
CALL_BEGIN, CALL_SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"


class DeepSeekV31Parser(TurnParser):
    name = "deepseek_v31"
    call_start, call_end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    stop_texts = (END_OF_SENTENCE,)

    def read_calls(self, body: str, schemas: dict[str, dict]) -> list[tuple[str, str]]:
        calls, pos = [], 0
        while (start := body.find(CALL_BEGIN, pos)) >= 0:
            if body[pos:start].strip():
                raise Malformed("text between the calls of the tool-call section")
            end = body.find(CALL_END, start)
            if end < 0:
                raise Malformed(f"a {CALL_BEGIN} call is never closed")
            name, sep, args = body[start + len(CALL_BEGIN) : end].partition(CALL_SEP)
            name = name.strip()
            if not sep or not name:
                raise Malformed(f"a call has no NAME{CALL_SEP}")
            check_known(name, schemas)
            calls.append((name, json_arguments(args)))
            pos = end + len(CALL_END)
        if body[pos:].strip() or not calls:
            raise Malformed("text after the calls of the tool-call section" if calls else "an empty tool-call section")
        return calls


class DeepSeekDsmlParser(TurnParser):
    name = "deepseek_dsml"
    call_start, call_end = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"
    stop_texts = (END_OF_SENTENCE,)
    _invokes = Invokes("｜DSML｜")

    def read_calls(self, body: str, schemas: dict[str, dict]) -> list[tuple[str, str]]:
        return self._invokes.read(body, schemas)


class DeepSeekV4Parser(DeepSeekDsmlParser):
    name = "deepseek_v4"
    call_start, call_end = "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"
