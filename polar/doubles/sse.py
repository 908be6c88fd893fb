"""Sending a streamed answer like a serving engine does, for the scripted TEST DOUBLE: paced, abortable, breakable.

A real model takes time (a wait before the first token, then one token after another), stops
generating when its client goes away (vLLM aborts the request), and can fail half-way. Tests of
polar's streaming need all three on cue, so the double's streams are sent here: `Pace` spaces the
tokens (and gives a plain answer the same total time), `Stats` counts what happened so a test can
assert "the upstream request was aborted", and a mid-stream fault either breaks the connection
after some tokens (no [DONE]) or sends vLLM's streaming error chunk.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from starlette.responses import Response

from polar.doubles.stream import DONE, Step

MID_STREAM = ("die_mid_stream", "error_mid_stream")


@dataclass
class Pace:
    """How long the model takes: before the first token (queue, prefill) and for each later one."""

    token_delay_s: float = 0.0
    first_token_delay_s: float = 0.0

    def before(self, token: int) -> float:
        """The wait before sampled token number `token` (0-based)."""
        return self.first_token_delay_s if token == 0 else self.token_delay_s

    def total(self, tokens: int) -> float:
        return sum(self.before(k) for k in range(tokens)) if tokens else self.first_token_delay_s

    def update(self, values: dict[str, Any]) -> None:
        for key in ("token_delay_s", "first_token_delay_s"):
            if key in values:
                value = values[key]
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise ValueError(f"{key} must be a number >= 0")
                setattr(self, key, float(value))


@dataclass
class Stats:
    """What the double's generations came to, for tests (GET /_double/stats)."""

    generations: int = 0  # requests with a body received
    streams_started: int = 0
    streams_finished: int = 0  # sent to [DONE]
    streams_aborted: int = 0  # the client went away mid-stream: generation stopped
    streams_failed: int = 0  # broken or errored by a mid-stream fault
    active_streams: int = 0
    tokens_streamed: int = 0  # tokens generated for streams (whether their parsers let a chunk out or not)
    calls_aborted: int = 0  # plain (non-stream) calls whose client went away while the model was busy

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def error_event(fault: dict[str, Any]) -> str:
    """vLLM's `create_streaming_error_response` (a GenerationError): json.dumps of its error body."""
    error = {"message": fault.get("message", "Internal server error"), "type": fault.get("type", "InternalServerError"),
             "param": None, "code": int(fault.get("status", 500))}
    return f"data: {json.dumps({'error': error})}\n\n"


async def wait_unless_gone(seconds: float, receive: Callable[[], Awaitable[dict]]) -> bool:
    """Sleep `seconds`, unless the client disconnects first: True when it did."""
    if seconds <= 0:
        return False
    listener = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait({listener}, timeout=seconds)
        return bool(done) and listener.result()
    finally:
        listener.cancel()


async def _disconnected(receive: Callable[[], Awaitable[dict]]) -> bool:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return True


class EventStream(Response):
    """text/event-stream of a double's answer: token steps paced by `pace`, stopped when the client leaves.

    Its headers go out with its first chunk, as vLLM's do (vLLM primes its stream before answering, so a
    request that fails while it queues or prefills is a plain error answer, never a broken stream)."""

    media_type = "text/event-stream"

    def __init__(self, steps: Iterator[Step], pace: Pace, stats: Stats, fault: dict[str, Any] | None = None):
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8")]  # chunked, as vLLM's
        self.steps, self.pace, self.stats, self.fault = steps, pace, stats, fault

    async def __call__(self, scope, receive, send) -> None:
        stats = self.stats
        stats.streams_started += 1
        stats.active_streams += 1
        gone = asyncio.ensure_future(_disconnected(receive))
        outcome = "aborted"
        started = False

        async def send_body(message: dict) -> None:
            nonlocal started
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send(message)

        try:
            outcome = await self._send_steps(send_body, gone)
        except OSError:  # the client's socket is gone under a send
            outcome = "aborted"
        finally:
            gone.cancel()
            stats.active_streams -= 1
            setattr(stats, f"streams_{outcome}", getattr(stats, f"streams_{outcome}") + 1)
        if outcome == "failed" and self.fault and self.fault.get("mode") == "die_mid_stream":
            raise ConnectionResetError("scripted death mid-stream")  # the server drops the connection: no [DONE]

    async def _send_steps(self, send, gone: asyncio.Future) -> str:
        sent = 0
        limit = int(self.fault.get("after_tokens", 0)) if self.fault else None
        for step in self.steps:
            if step.tokens and limit is not None and sent >= limit:
                if self.fault["mode"] == "error_mid_stream":
                    await send({"type": "http.response.body", "body": (error_event(self.fault) + DONE).encode(),
                                "more_body": False})
                return "failed"
            for _ in range(step.tokens):
                delay = self.pace.before(sent)
                if delay > 0:
                    await asyncio.wait({gone}, timeout=delay)
                if gone.done():
                    return "aborted"  # as vLLM aborts a request whose client left: no more tokens
                sent += 1
            if gone.done():
                return "aborted"
            if step.events:
                await send({"type": "http.response.body", "body": "".join(step.events).encode(), "more_body": True})
            self.stats.tokens_streamed += step.tokens
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "finished"

