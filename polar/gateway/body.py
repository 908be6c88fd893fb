"""A model call's body → JSON, with the limits checked before the decoder sees it.

Size, content type and nesting depth are refused as client errors (the caller's provider renders
them). Depth is measured on the decoded value, container by container: a body that decodes near
Python's recursion limit would still crash the recursive code after it (validation, capture
encoding, templates) as a 500, and the C decoder itself raises RecursionError on deeper ones. Walking
the decoded containers costs a fraction of decoding; measuring on the text (strings blanked by a
regex) cost 4x the decode of an agent's 400 KB body.
"""

from __future__ import annotations

import json
import re
from typing import Any

from polar.errors import GatewayError

MAX_DEPTH = 128  # far beyond any real request (tool schemas nest a few dozen levels at most)

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # \ud800-\udfff: paired (an emoji) or not


def decode_json(body: bytes, content_type: str | None, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The decoded body; a GatewayError for anything a client must fix."""
    if len(body) > max_bytes:
        raise GatewayError("too_large", f"request body is {len(body)} bytes; polar accepts at most {max_bytes}")
    check_content_type(content_type)
    if not body:
        raise GatewayError("invalid_request", "request body is empty; a JSON object is required")
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
        raise GatewayError("invalid_request", f"request body nests JSON too deeply (more than {max_depth} levels)")
    if _SURROGATE_ESCAPE.search(text):
        check_surrogates(value)
    return value


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
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        if not level:
            return False
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
    return bool(level)
