"""A chat-mode answer's prompt ids, read without re-reading what the session already holds.

vLLM's chat answer (or its stream's first chunk) carries the whole prompt's ids as JSON text: 100k+
numbers at agent size, parsed into Python ints and converted on every turn although all but the last
turn's additions are the ids of the session's previous turn. Here the array's text is cut out of the
answer before it is parsed, compared byte for byte with the previous turn's ids written as JSON
(orjson writes 128k ids in well under a millisecond), and only the text past the last id the two share
is parsed. Equal text is equal ids, so the result is exactly what a full parse gives; anything that
does not fit the expected shape takes the full parse.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

from polar.capture.tokens import common_prefix_len
from polar.upstream.http import response_json
from polar.upstream.results import token_array

_ARRAY = re.compile(rb'"prompt_token_ids"\s*:\s*\[')
# Stands in for the cut-out array; found back at the top level only if the cut was the top-level key's value.
_MARKER = "\x00polar:prompt_token_ids"
_MARKER_JSON = orjson.dumps(_MARKER)


def read_chat_answer(raw: bytes | str, known: np.ndarray | None) -> Any:
    """An answer (or stream chunk) as response_json reads it, its `prompt_token_ids` already a uint32 array.
    `known`: the ids the session's previous turn holds (prompt + sampled), or None."""
    raw = raw.encode() if isinstance(raw, str) else raw
    found = _ARRAY.search(raw)
    end = raw.find(b"]", found.end()) if found else -1
    if end < 0:
        return _full(raw)
    try:
        data = orjson.loads(b"".join([raw[: found.end() - 1], _MARKER_JSON, raw[end + 1:]]))
    except orjson.JSONDecodeError:
        return _full(raw)
    if not isinstance(data, dict) or data.get("prompt_token_ids") != _MARKER:
        return _full(raw)  # the key was not the top-level one
    try:
        data["prompt_token_ids"] = ids_past_known(raw[found.end() - 1: end + 1], known)
    except (orjson.JSONDecodeError, TypeError):
        return _full(raw)  # not a flat array of numbers: the full parse says what it is
    return data


# Below this much id text (~1.3k ids) parsing it all is faster than writing and comparing the known ids;
# past it the comparison wins, the more so the longer the ids.
COMPARE_FROM_BYTES = 8 * 1024


def ids_past_known(text: bytes, known: np.ndarray | None) -> np.ndarray:
    """A JSON array of token ids, parsed only past the ids it shares with `known` (compared as text)."""
    shared = 0
    if known is not None and len(known) and len(text) >= COMPARE_FROM_BYTES:
        known_text = orjson.dumps(np.ascontiguousarray(known), option=orjson.OPT_SERIALIZE_NUMPY)
        comma = text.find(b",")
        if comma > 0 and text[comma + 1:comma + 2] == b" ":  # an upstream writing `1, 2` (vLLM writes `1,2`)
            known_text = known_text.replace(b",", b", ")
        chars = np.frombuffer(text, np.uint8)
        mismatch = common_prefix_len(chars, np.frombuffer(known_text, np.uint8))
        # Every id ended by a comma before the first differing byte is the same number in both texts.
        last_comma = text.rfind(b",", 0, mismatch)
        if last_comma > 0:
            shared = int(np.count_nonzero(chars[: last_comma + 1] == ord(",")))  # bytes.count is ~8x slower
            text = b"[" + text[last_comma + 1:]
    rest = token_array(orjson.loads(text), "prompt_token_ids")
    return np.concatenate([known[:shared], rest]) if shared else rest


def _full(raw: bytes) -> Any:
    data = response_json(raw)
    if isinstance(data, dict) and data.get("prompt_token_ids") is not None:
        data["prompt_token_ids"] = token_array(data["prompt_token_ids"], "prompt_token_ids")
    return data
