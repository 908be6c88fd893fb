"""The one vocabulary every provider validates request bodies with.

Each check names the field by its full path in the body (`messages[2].content[0].text`), so a
client learns exactly what to fix, in any provider's error shape. `key` may be several names
(Gemini accepts lowerCamel and snake_case): the first one present is read, the first one is named.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

from polar.errors import GatewayError

Types = type | tuple[type, ...]
Key = str | Sequence[str]

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array", dict: "an object"}
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def invalid(message: str, param: str | None = None) -> GatewayError:
    return GatewayError("invalid_request", message, param=param)


def expect(value: Any, typ: Types, where: str) -> Any:
    """`value`, found at `where`, when it has the JSON type `typ` (a boolean is not a number)."""
    kind = type(value)
    if kind is typ or (kind is not bool and type(typ) is tuple and kind in typ):  # the common case, quickly
        return value
    types = typ if isinstance(typ, tuple) else (typ,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join(_NAMES.get(t, t.__name__) for t in types)
        got = "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)
        raise invalid(f"field '{where}' must be {names}, got {got}", where)
    return value


def body_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    return body


def _name(body: dict, key: Key) -> str:
    if isinstance(key, str):
        return key
    for name in key:
        if body.get(name) is not None:
            return name
    return key[0]


# Every block of every message is checked on every call (a turn re-sends the whole history), so the
# common case — present, of the right type — builds no path string and calls nothing further.


def require(body: dict, key: Key, typ: Types, where: str = "") -> Any:
    """A required field of `body` (whose own path is the prefix `where`, e.g. "tools[0].")."""
    if not isinstance(body, dict):
        raise invalid(f"field '{where.rstrip('.') or 'request body'}' must be an object", where.rstrip(".") or None)
    name = _name(body, key)
    value = body.get(name)
    if value is None:
        raise invalid(f"missing required field '{where}{name}'", f"{where}{name}")
    if type(value) is typ:  # the common case, without building the path
        return value
    return expect(value, typ, f"{where}{name}")


def optional(body: dict, key: Key, typ: Types, where: str = "", default: Any = None) -> Any:
    """Like `require`, but an absent or null field gives `default`."""
    if not isinstance(body, dict) or body.get(_name(body, key)) is None:
        return default
    return require(body, key, typ, where)


def number(body: dict, key: Key, where: str = "") -> float | None:
    """An optional finite number (JSON allows integers too large for a float)."""
    value = optional(body, key, (int, float), where)
    if value is None:
        return None
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        path = f"{where}{_name(body, key)}"
        raise invalid(f"field '{path}' must be a finite number", path)
    return value


def integer(body: dict, key: Key, where: str = "") -> int | None:
    """An optional integer; protobuf JSON clients may send one as 3.0."""
    value = optional(body, key, (int, float), where)
    if isinstance(value, float) and not value.is_integer():
        path = f"{where}{_name(body, key)}"
        raise invalid(f"field '{path}' must be an integer", path)
    return None if value is None else int(value)


def strings(value: Any, where: str) -> list[str]:
    """An array of strings."""
    for i, item in enumerate(expect(value, list, where)):
        expect(item, str, f"{where}[{i}]")
    return value


@cache
def proto_names(camel: str) -> tuple[str, str]:
    """A protobuf JSON field's two accepted names: lowerCamel (named in errors) and snake_case."""
    return camel, re.sub(r"[A-Z]", lambda m: "_" + m[0].lower(), camel)
