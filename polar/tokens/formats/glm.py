"""GLM-4.5 / 4.6 / 4.7 (vLLM's `glm45` / `glm47`): `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`,
4.5/4.6 with a newline after the name and each tag, 4.7 compact. A value is text; the tool's schema types it."""

from __future__ import annotations

import json
import re
from typing import Any

from polar.tokens.turn_parser import Malformed, TurnParser, check_known, schema_properties, typed_value


class GlmParser(TurnParser):
    name = "glm45"
    call_start, call_end = "<tool_call>", "</tool_call>"
    # The template ends an answer before the next turn's role token (GLM's stop ids).
    stop_texts = ("<|user|>", "<|observation|>", "<|endoftext|>")
    _arg = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

    def read_call(self, body: str, schemas: dict[str, dict]) -> tuple[str, str]:
        at = body.find("<arg_key>")
        name = (body if at < 0 else body[:at]).strip()
        if not name or "\n" in name or "<" in name:
            raise Malformed("the tool call does not start with a function name")
        check_known(name, schemas)
        props = schema_properties(schemas.get(name))
        args: dict[str, Any] = {}
        rest = body[at:] if at >= 0 else ""
        for m in self._arg.finditer(rest):
            key = m.group(1).strip()
            args[key] = typed_value(m.group(2), props.get(key))
        if self._arg.sub("", rest).strip():
            raise Malformed("text outside the <arg_key>/<arg_value> pairs of the tool call")
        return name, json.dumps(args, ensure_ascii=False)
