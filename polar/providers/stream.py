"""What every provider's stream is made of: SSE events, text cut into deltas, and the renderer interface.

A `StreamRenderer` turns one sampled turn into a provider's stream body as the upstream produces it:
the gateway hands it deltas (`polar.canonical.Delta`) the moment they are known and writes the bytes
it returns straight to the client. It keeps the provider's block/item bookkeeping; the upstream never
sees a wire format. `replay` feeds a finished `ChatResult` through the same renderer, so a complete
answer and a live one share one code path and always agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from polar.canonical import ChatResult, Delta, ReasoningDelta, TextDelta, ToolCallDelta
from polar.errors import GatewayError
from polar.json_values import compact

_WORDS = re.compile(r"\s*\S+|\s+")
CONTENT_TYPE = "text/event-stream; charset=utf-8"


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
    payload = data.encode() if isinstance(data, str) else compact(data)
    head = f"event: {event}\n".encode() if event else b""
    return b"".join([head, b"data: ", payload, b"\n\n"])


# An SSE comment: every spec-following client skips it, and it keeps idle connections alive.
SSE_COMMENT = b": keep-alive\n\n"


class StreamRenderer:
    """One call's stream, in one provider's shape. Each method returns the bytes to send now (maybe none).

    Order of calls: `opening` (again whenever the prompt size becomes known; it sends its events once),
    `delta` for each delta, `keepalive` whenever the upstream is silent for a while, then either
    `finish` with the final result (everything that closes the stream, terminal event last) or `error`.
    """

    content_type = CONTENT_TYPE

    def opening(self, prompt_tokens: int | None) -> bytes:
        """The events that open the stream, once; b"" until the renderer can open (Anthropic needs the
        prompt size) or after it has."""
        raise NotImplementedError

    def delta(self, delta: Delta) -> bytes:
        raise NotImplementedError

    def keepalive(self) -> bytes:
        return SSE_COMMENT

    def finish(self, result: ChatResult) -> bytes:
        """Close what is open and end the stream with the provider's terminal event."""
        raise NotImplementedError

    def error(self, error: GatewayError, status: int) -> bytes:
        """The provider's in-stream error event: the stream broke after it had started."""
        raise NotImplementedError


def result_deltas(result: ChatResult, max_chars: int = 16) -> Iterator[Delta]:
    """A finished answer as the deltas an upstream would have streamed: reasoning, text, then the calls."""
    if result.reasoning is not None and result.reasoning.text and not result.reasoning.redacted:
        for piece in pieces(result.reasoning.text, max_chars):
            yield ReasoningDelta(piece)
    for piece in pieces(result.content, max_chars):
        yield TextDelta(piece)
    for index, call in enumerate(result.tool_calls):
        yield ToolCallDelta(index, call.arguments, id=call.id, name=call.name, complete=True)


def replay(renderer: StreamRenderer, result: ChatResult) -> bytes:
    """The whole stream of a finished answer (tests, and a backend that cannot stream)."""
    out = [renderer.opening(result.usage.prompt_tokens)]
    out += [renderer.delta(d) for d in result_deltas(result)]
    out.append(renderer.finish(result))
    return b"".join(out)
