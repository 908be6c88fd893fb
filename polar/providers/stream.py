"""What every provider's stream is made of: SSE events and text cut into deltas."""

from __future__ import annotations

import json
import re
from typing import Any

_WORDS = re.compile(r"\s*\S+|\s+")


def pieces(text: str, max_chars: int) -> list[str]:
    """Cut text into deltas of at most `max_chars` whose concatenation is exactly `text`: whole words
    (with the spaces before them) while they fit, and a longer run without spaces (JSON, base64) cut
    every `max_chars`, so it streams too."""
    out: list[str] = []
    for word in _WORDS.findall(text):
        for cut in (word[i : i + max_chars] for i in range(0, len(word), max_chars)):
            if out and len(out[-1]) + len(cut) <= max_chars:
                out[-1] += cut
            else:
                out.append(cut)
    return out


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One SSE event. `data` that is not already a string is JSON-encoded on one line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()
