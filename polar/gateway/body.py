"""A model call's body → JSON, with the limits checked before the decoder sees it.

Size, content type and nesting depth are refused as client errors (the caller's provider renders
them). Depth is measured on the decoded value, container by container: a body that decodes near
Python's recursion limit would still crash the recursive code after it (validation, capture
encoding, templates) as a 500, and the C decoder itself raises RecursionError on deeper ones. Walking
the decoded containers costs a fraction of decoding; measuring on the text (strings blanked by a
regex) cost several times the decode itself.

An agent re-sends its whole history on every call, so decoding is the one per-call cost that grows with
it: orjson decodes an agent's body in well under half `json`'s time. Where the two could
disagree, `json` decides: orjson refuses what `json` takes (NaN, a BOM, UTF-16, lone surrogates, 1e400)
and the body then goes the `json` way; and orjson turns an integer beyond 64 bits into a float, so a
decoded float at or beyond 2**63 (a walk that the depth check makes anyway) sends the body the `json` way
too: a tool argument's big integer reaches the model digit for digit.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from polar.errors import GatewayError

MAX_DEPTH = 128  # far beyond any real request (tool schemas nest a few dozen levels at most)

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # \ud800-\udfff: paired (an emoji) or not


def decode_json(body: bytes, content_type: str | None, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The decoded body; a GatewayError for anything a client must fix."""
    return decode(body, content_type, max_bytes, max_depth)[0]


def decode(body: bytes, content_type: str | None, max_bytes: int, max_depth: int = MAX_DEPTH) -> tuple[Any, bool]:
    """The decoded body, and whether orjson decoded it: then every value in it is one orjson writes back as
    JSON with the same meaning (no NaN or infinity, no integer past 64 bits), which json_values relies on."""
    if len(body) > max_bytes:
        raise GatewayError("too_large", f"request body is {len(body)} bytes; polar accepts at most {max_bytes}")
    check_content_type(content_type)
    if not body:
        raise GatewayError("invalid_request", "request body is empty; a JSON object is required")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:  # not strict UTF-8 JSON: `json` takes it or says why not
        return _decode_as_json(body, max_depth), False
    deep, inexact = _walk(value, max_depth)
    if inexact:
        return _decode_as_json(body, max_depth), False
    if deep:
        raise _too_deep(max_depth)
    return value, True


def _decode_as_json(body: bytes, max_depth: int) -> Any:
    try:
        text = body.decode(json.detect_encoding(body))  # strict: no lone surrogates from raw bytes
    except UnicodeDecodeError as exc:
        raise GatewayError("invalid_request", f"request body is not valid JSON: {exc}") from None
    try:
        value = json.loads(text)
        deep = nests_deeper(value, max_depth)
    except json.JSONDecodeError as exc:
        raise GatewayError("invalid_request", f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # deeper than the decoder goes: deeper than any limit
        deep = True
    if deep:
        raise _too_deep(max_depth)
    if _SURROGATE_ESCAPE.search(text):
        check_surrogates(value)
    return value


def _too_deep(max_depth: int) -> GatewayError:
    return GatewayError("invalid_request", f"request body nests JSON too deeply (more than {max_depth} levels)")


def check_surrogates(value: Any) -> None:
    """Refuse strings holding an unpaired UTF-16 surrogate (a `\\ud83d` cut from its pair): no tokenizer,
    no UTF-8 capture can hold one. Anthropic's API refuses them with a 400 too."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise GatewayError("invalid_request", "request body is not valid JSON: a string holds an unpaired "
                                              f"UTF-16 surrogate (\\u{ord(exc.object[exc.start]):04x})") from None


def check_content_type(content_type: str | None) -> None:
    """JSON, or no content type at all (some clients omit it); anything else is a 415."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise GatewayError("invalid_request", f"content-type {media!r} is not supported; "
                                              "send the request body as application/json", status=415)


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether arrays and objects in `value` nest more than `limit` levels (level by level, no recursion)."""
    return _walk(value, limit)[0]


_INEXACT = 2.0**63  # orjson decodes integers past 64 bits as floats: a float this large may have been one


def _walk(value: Any, limit: int) -> tuple[bool, bool]:
    """(containers nest deeper than `limit`, a float at or beyond 2**63 was seen on the levels walked).
    Level by level, no recursion; exact type checks, since decoders make plain dicts and lists (and
    `isinstance` with a tuple of types costs twice as much over an agent's thousands of values)."""
    level = [value] if type(value) is dict or type(value) is list else []
    inexact = type(value) is float and abs(value) >= _INEXACT
    for _ in range(limit):
        if not level:
            return False, inexact
        below = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is dict or kind is list:
                    below.append(child)
                elif kind is float and (child >= _INEXACT or child <= -_INEXACT):
                    inexact = True
        level = below
    return bool(level), inexact
