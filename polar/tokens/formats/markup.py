"""Reading the pieces several families' calls share: `<invoke name="N">` / `<parameter name="K">` XML
(MiniMax-M2, DeepSeek-V3.2/V4's DSML) and JSON arguments kept as the model wrote them (DeepSeek-V3.1, Kimi-K2)."""

from __future__ import annotations

import json
import re
from typing import Any

from polar.tokens.turn_parser import Malformed, check_known, reject_constant, schema_properties, typed_value


def json_arguments(text: str) -> str:
    """Arguments written as a JSON object: its exact text (never re-serialised), or Malformed."""
    raw = text.strip()
    if not raw:
        return "{}"
    try:
        obj = json.loads(raw, parse_constant=reject_constant)
    except (ValueError, RecursionError) as exc:
        raise Malformed(f"the arguments are not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise Malformed("the arguments are not a JSON object")
    return raw


class Invokes:
    """`<{p}invoke name="N">` … `</{p}invoke>` blocks holding `<{p}parameter name="K" …>V</{p}parameter>`."""

    def __init__(self, prefix: str = ""):
        p = re.escape(prefix)
        self.invoke = re.compile(rf'<{p}invoke name="([^"\n]*)">(.*?)</{p}invoke>', re.S)
        self.parameter = re.compile(rf'<{p}parameter name="([^"\n]*)"((?: [a-z_]+="[^"\n]*")*)>(.*?)</{p}parameter>', re.S)
        self.tag = f"<{prefix}invoke"

    def read(self, body: str, schemas: dict[str, dict]) -> list[tuple[str, str]]:
        calls, pos = [], 0
        for m in self.invoke.finditer(body):
            if body[pos : m.start()].strip():
                raise Malformed("text between the invoke blocks of the tool call")
            calls.append(self._one(m.group(1).strip(), m.group(2), schemas))
            pos = m.end()
        if body[pos:].strip():
            raise Malformed(f"a {self.tag} block is never closed" if self.tag in body[pos:] else "text after the invokes")
        if not calls:
            raise Malformed(f"no {self.tag} name=...> inside the tool call")
        return calls

    def _one(self, name: str, inner: str, schemas: dict[str, dict]) -> tuple[str, str]:
        if not name:
            raise Malformed("an invoke has no name")
        check_known(name, schemas)
        props = schema_properties(schemas.get(name))
        args: dict[str, Any] = {}
        for pm in self.parameter.finditer(inner):
            key, attrs, value = pm.group(1).strip(), pm.group(2), pm.group(3)
            if 'string="true"' in attrs:
                args[key] = value
            elif 'string="false"' in attrs:
                args[key] = typed_value(value, {"type": "object"})
            else:
                args[key] = typed_value(value.strip("\n"), props.get(key))
        if self.parameter.sub("", inner).strip():
            raise Malformed("text outside the parameters of an invoke")
        return name, json.dumps(args, ensure_ascii=False)
