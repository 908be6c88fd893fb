"""JSON values compared as JSON: Python's `==` takes 1 == 1.0 == True and 0.0 == -0.0, which JSON writes
differently — and a chat template renders a tool argument or a schema as written. Reusing what was read
from one value for another (providers/history.py, capture/records.py) needs both to be the same JSON."""

from __future__ import annotations

import json
from typing import Any

import orjson


def exact(value: Any) -> bytes | None:
    """The value's JSON text, type for type (orjson: ~1.5 GB/s), or None when orjson cannot write it (an
    integer past 64 bits): such a value is the same as nothing."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return None


def same(value: Any, other: Any, other_text: bytes | None) -> bool:
    """Whether `value` is the JSON `other` is (`other_text`: `exact(other)`, kept with it). `==` first: it
    stops at the first difference, and tells NaN from null, which orjson writes alike."""
    return value is other or (other_text is not None and value == other and exact(value) == other_text)


def compact(value: Any) -> bytes:
    """Compact JSON as UTF-8 bytes, what every answer, stream event and upstream request is written as:
    orjson (~10x json's speed on a stream's many small events and a prompt's 100k+ ids; numpy arrays as
    lists). What orjson refuses (an integer past 64 bits, a client's seed) json writes."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
