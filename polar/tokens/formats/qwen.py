"""Qwen's tool calls: JSON in `<tool_call>` (Qwen2.5, Qwen3 hybrid, Hermes-style) and XML (Qwen3-Coder, Qwen3.5, Nemotron-3)."""

from __future__ import annotations

import json
import re
from typing import Any

from polar.tokens.turn_parser import (
    Malformed,
    TurnParser,
    check_known,
    member_texts,
    reject_constant,
    schema_properties,
    typed_value,
    unpad,
)


class Qwen3JsonParser(TurnParser):
    """Qwen3 / Qwen2.5 (vLLM's `hermes`): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

    `arguments` is sliced out of the sample exactly as the model wrote it (compact or spaced,
    escaped or raw non-ASCII), never re-serialised, so the tool call a client receives carries the
    model's own text.
    """

    name = "qwen3"
    call_start, call_end = "<tool_call>", "</tool_call>"

    def read_call(self, body: str, schemas: dict[str, dict]) -> tuple[str, str]:
        text = body.strip()
        try:
            obj = json.loads(text, parse_constant=reject_constant)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise Malformed(f"the tool call is not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise Malformed("the tool call is not a JSON object")
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise Malformed('the tool call has no "name" string')
        check_known(name, schemas)
        raw = member_texts(text).get("arguments")
        args = obj.get("arguments")
        if raw is None or args is None:
            return name, "{}"
        if isinstance(args, dict):
            return name, raw
        if isinstance(args, str):  # some models write the object as a JSON string
            try:
                inner = json.loads(args, parse_constant=reject_constant)
            except (ValueError, RecursionError):
                inner = None
            if isinstance(inner, dict):
                return name, args
        raise Malformed('"arguments" is not a JSON object')


class Qwen3XmlParser(TurnParser):
    """Qwen3.5 / Qwen3-Coder (vLLM's `qwen3_xml` / `qwen3_coder`):

        <tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

    A value is text; the tool's JSON schema says how to type it (strings stay strings; numbers,
    booleans, objects and arrays are read as JSON, falling back to the text). The arguments are then
    written with json.dumps(ensure_ascii=False): the model never wrote JSON, so there is none to keep.
    """

    name = "qwen3_xml"
    call_start, call_end = "<tool_call>", "</tool_call>"
    _function = re.compile(r"\s*<function=([^>\n]*)>(.*)</function>\s*", re.S)
    _parameter = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.S)

    def read_call(self, body: str, schemas: dict[str, dict]) -> tuple[str, str]:
        m = self._function.fullmatch(body)
        if not m:
            if "<function=" not in body:
                raise Malformed("no <function=NAME> inside the tool call")
            if "</function>" not in body:
                raise Malformed("the <function=...> block is never closed")
            raise Malformed("text around the <function=...> block inside the tool call")
        name, inner = m.group(1).strip(), m.group(2)
        if not name:
            raise Malformed("the <function=...> tag has no name")
        check_known(name, schemas)
        props = schema_properties(schemas.get(name))
        args: dict[str, Any] = {}
        for pm in self._parameter.finditer(inner):
            key = pm.group(1).strip()
            args[key] = typed_value(unpad(pm.group(2)), props.get(key))
        leftover = self._parameter.sub("", inner).strip()
        if leftover:
            if "<parameter=" in leftover:
                raise Malformed("a <parameter=...> block is never closed")
            raise Malformed("text outside the <parameter=...> blocks of the function")
        return name, json.dumps(args, ensure_ascii=False)
