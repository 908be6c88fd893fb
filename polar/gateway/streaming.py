"""One streamed model call, from the upstream's first chunk to its committed capture.

Whoever writes the answer to the client (the mitmproxy relay, mitm/relay.py, or a test) first awaits
`begin`: vLLM sends a stream's headers only with its first token, and a request it refuses within
`keepalive_s` (a bad or too long prompt, an overloaded engine) gets a plain error answer in the
provider's shape; past that the upstream is queueing or prefilling and the stream starts. The body is
an async iterator of bytes (`chunks`): each upstream chunk is rendered and handed on at once; silences
longer than `keepalive_s` get the provider's keep-alive.
The capture row, with every token id, is committed before the stream's terminal event goes out;
if that commit fails the client gets the provider's error event instead of an end it could trust.

How a stream can end, and what the row then says:
- finished: status ok, the whole turn (its terminal event follows the commit);
- the upstream breaks off or fails mid-stream: the provider's error event, the row an error with the
  tokens sampled so far;
- the client goes away (or never comes to read): the upstream request is closed at once, so vLLM
  aborts it and frees the sequence, and the row is kept with the partial tokens as client_disconnected;
- the upstream refuses before the stream began: the plain error answer, an error row.
Exactly one of these settles each call, once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from polar.canonical import ChatResult, Delta, ReasoningDelta, TextDelta, coalesced
from polar.capture.records import CallEnd
from polar.errors import GatewayError
from polar.providers.base import HttpReply
from polar.providers.stream import StreamRenderer
from polar.upstream.base import UpstreamStream

log = logging.getLogger("polar.gateway")

# settle(end, result) → None once the row committed, else why it could not be. Given by the pipeline: it
# fills the row from what the call learnt, commits it and remembers the turn.
Settle = Callable[[CallEnd, ChatResult | None], Awaitable[str | None]]

CLIENT_GONE = "client_disconnected"


@dataclass
class StreamReply:
    """A streamed answer: status and headers now, the body as the upstream produces it."""

    status: int
    headers: dict[str, str]
    call: StreamingCall


@dataclass
class _Fed:
    """What the client was sent, to check it against the final parse."""

    reasoning: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)  # index → [id, name, argument pieces…]
    text_after_call: bool = False
    first_at: float | None = None

    def add(self, delta: Delta) -> None:
        if isinstance(delta, ReasoningDelta):
            self.reasoning.append(delta.text)
        elif isinstance(delta, TextDelta):
            self.text.append(delta.text)
            self.text_after_call = self.text_after_call or (bool(self.calls) and bool(delta.text.strip()))
        else:
            self.calls.setdefault(delta.index, [delta.id or "", delta.name or ""]).append(delta.arguments)

    def differences(self, result: ChatResult) -> list[str]:
        """Notes for the capture when the streamed answer is not the final one (never expected but the
        late-text case; a check against a parser drifting from the stream)."""
        notes = []
        reasoning = result.reasoning.text if result.reasoning and not result.reasoning.redacted else ""
        if "".join(self.reasoning) != reasoning:
            notes.append("stream: the streamed reasoning differs from the final parse")
        if "".join(self.text) != result.content:
            notes.append("stream: the streamed text differs from the final parse")
        calls = [(c[0], c[1], "".join(c[2:])) for c in self.calls.values()]
        if calls != [(c.id, c.name, c.arguments) for c in result.tool_calls]:
            notes.append("stream: the streamed tool calls differ from the final parse")
        if self.text_after_call:
            notes.append("stream: text the model wrote after a tool call was sent after that call "
                         "(the answer's own shape puts all text first)")
        return notes


class StreamingCall:
    def __init__(self, upstream: UpstreamStream, renderer: StreamRenderer, settle: Settle, slot: AsyncExitStack,
                 keepalive_s: float = 0.0, provider_status: Callable[[GatewayError], int] | None = None,
                 refuse: Callable[[GatewayError], tuple[HttpReply, CallEnd]] | None = None,
                 headers: dict[str, str] | None = None):
        self.upstream, self.renderer, self._settle, self._slot = upstream, renderer, settle, slot
        self.keepalive_s = keepalive_s
        self._status = provider_status or (lambda err: 500)
        self._refuse = refuse  # an error → the provider's plain error answer and its row
        self._headers = headers or {}  # what every answer of the call carries (its call id, its session)
        self.begun = False
        self.fed = _Fed()
        self.sent: list[bytes] = []
        self.started = False
        self.settled = False
        self._done = asyncio.Event()
        self._cleanup: asyncio.Task | None = None
        self._settling: asyncio.Task | None = None
        # The upstream is read by a task of its own into this queue, so the body can wait for it with a
        # keep-alive timeout without ever cancelling a read, and take all that arrived at once.
        self._chunks: asyncio.Queue = asyncio.Queue(maxsize=_QUEUED_CHUNKS)
        self._reader: asyncio.Task | None = None
        self._active = time.monotonic()  # when the client last got something
        self._watchdog: asyncio.TimerHandle | None = None
        self._stopped: GatewayError | None = None  # polar is stopping (`stop`): the error event that ends the answer

    async def begin(self) -> HttpReply | None:
        """Wait up to `keepalive_s` for the upstream to take the request. None: stream the body. Else the
        upstream refused meanwhile: the row is settled and this plain error answer goes instead."""
        self.begun = True
        try:
            await self.upstream.accepted(self.keepalive_s if self.keepalive_s > 0 else None)
            return None
        except (asyncio.CancelledError, GeneratorExit):  # the client went away during queue or prefill
            self.abandon()
            raise
        except GatewayError as err:
            if self._refuse is None:
                raise
            reply, end = self._refuse(err)
            if failure := await self._finish(end, None):
                reply, _ = self._refuse(GatewayError("internal", f"polar could not record this call: {failure}"))
            reply.headers.update(self._headers)
            return reply

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk. Drain it to the end, or `aclose` it (then `abandon`) when the client goes."""
        if self.started or self.settled:
            raise RuntimeError("a streamed answer can be read once")
        self.started = True
        try:
            if self._stopped is not None:
                raise self._stopped
            if not self.begun:
                await self.upstream.accepted(None)  # (a late refusal raises: the stream's error event)
            opening = self.renderer.opening(self.upstream.prompt_tokens)
            if opening:
                yield self._sent(opening)
            self._reader = asyncio.ensure_future(_read_into(self.upstream, self._chunks))
            self._watch()
            ended = False
            while not ended:
                batch = await self._next_batch()
                if all(item is _SILENCE for item in batch):  # queue, prefill, a long pause
                    yield self._sent(self.renderer.keepalive())
                    continue
                out = self.renderer.opening(self.upstream.prompt_tokens)
                deltas, failure = [], None
                for item in batch:  # every upstream chunk that arrived meanwhile: one write for all
                    if item is _END:
                        ended = True
                        break
                    if isinstance(item, BaseException):
                        failure = item
                        break
                    if item is not _SILENCE:
                        deltas += item
                for delta in coalesced(deltas):
                    self.fed.add(delta)
                    out += self.renderer.delta(delta)
                if out:  # (what came before a failure, then its error event)
                    self.fed.first_at = self.fed.first_at or time.time()
                    self._active = time.monotonic()
                    yield self._sent(out)
                if failure is not None:
                    raise failure
            result = self.upstream.result()
            tail = self.renderer.finish(result)
            self.fed.first_at = self.fed.first_at or time.time()  # an answer that went out whole, at its end
        except (asyncio.CancelledError, GeneratorExit):  # the client went away while we waited upstream
            self.abandon()
            raise
        except Exception as exc:  # the upstream broke off, timed out or failed mid-stream (or a polar bug)
            err = exc if isinstance(exc, GatewayError) else GatewayError("internal", f"polar failed mid-stream: {exc!r}")
            if not isinstance(exc, GatewayError):
                log.exception("polar failed mid-stream")
            tail = self.renderer.error(err, self._status(err))
            await self._finish(self._broken(err, tail), self._partial())
            yield self._sent(tail)
            return
        end = CallEnd(status="ok", http_status=200, response_body=b"".join([*self.sent, tail]), t_end=0.0,
                      rewrites=self.fed.differences(result))
        if failure := await self._finish(end, result):  # not durable: the client must not take it as the end
            failed = GatewayError("internal", f"polar could not record this call: {failure}")
            yield self._sent(self.renderer.error(failed, self._status(failed)))
            return
        yield self._sent(tail)

    def abandon(self) -> None:
        """The client is gone (or never came to read): abort upstream and keep what was sampled. Idempotent;
        the work runs in a task of its own, so a cancelled caller cannot cut it short."""
        if self.settled or self._cleanup is not None:
            return
        self._cleanup = asyncio.get_running_loop().create_task(self._record_disconnect())

    def stop(self, err: GatewayError) -> None:
        """polar is stopping: end the answer now with `err` as the provider's error event, after what the client
        was sent; the row keeps every token sampled so far. A stream no client reads yet ends so when it is read
        (or is abandoned unread, as any)."""
        if self.settled or self._stopped is not None:
            return
        self._stopped = err
        if not self.started:
            return
        if self._reader is not None:
            self._reader.cancel()
        if self._chunks.full():  # a client thousands of chunks behind: it loses the oldest batch, not the end
            self._chunks.get_nowait()
        self._chunks.put_nowait(err)

    async def wait_settled(self) -> None:
        """Until the call's row is committed (or could not be) and its upstream is closed."""
        await self._done.wait()

    # -- settling ---------------------------------------------------------------------------------

    async def _next_batch(self) -> list[Any]:
        """The upstream chunks that arrived since the last write (at least one item; _SILENCE when the
        watchdog saw none for `keepalive_s`)."""
        queue = self._chunks
        batch = [await queue.get()]
        while not queue.empty():
            batch.append(queue.get_nowait())
        return batch

    def _watch(self) -> None:
        """Every `keepalive_s`, a _SILENCE marker when nothing went out for that long: one timer per interval,
        never one per chunk (a timer per read showed as ~6% of the proxy's CPU under load)."""
        if self.keepalive_s <= 0 or self.settled:
            return
        idle = time.monotonic() - self._active
        if idle >= self.keepalive_s and not self._chunks.full():
            self._chunks.put_nowait(_SILENCE)
            self._active = time.monotonic()
            idle = 0.0
        self._watchdog = asyncio.get_running_loop().call_later(self.keepalive_s - idle, self._watch)

    async def _record_disconnect(self) -> None:
        if self._reader is not None:
            self._reader.cancel()  # (and _settle_and_release closes the upstream)
        await self.upstream.aclose()
        partial = self._partial()
        n = len(partial.completion_token_ids) if partial is not None else 0
        end = CallEnd(status=CLIENT_GONE, http_status=200, response_body=b"".join(self.sent), t_end=0.0,
                      error_kind=CLIENT_GONE, finish_reason="abort",
                      error=f"the client closed the stream after {n} sampled tokens; the upstream request was aborted")
        await self._finish(end, partial)

    def _broken(self, err: GatewayError, tail: bytes) -> CallEnd:
        return CallEnd(status="error", http_status=200, response_body=b"".join([*self.sent, tail]), t_end=0.0,
                       error_kind=err.kind, error=err.message, finish_reason="abort", replica=err.replica)

    def _partial(self) -> ChatResult | None:
        try:
            return self.upstream.partial()
        except Exception:  # noqa: BLE001 — a turn too broken to read still leaves its row
            log.exception("could not read the partial turn of a broken stream")
            return None

    async def _finish(self, end: CallEnd, result: ChatResult | None) -> str | None:
        """Settle the call once. The commit runs in a task of its own: a client leaving during it cannot
        cut it short (the row, the session state and the sampling slot all get done)."""
        if self.settled:
            return None
        self.settled = True
        self._settling = asyncio.ensure_future(self._settle_and_release(end, result))  # (held: tasks are weakly kept)
        return await asyncio.shield(self._settling)

    async def _settle_and_release(self, end: CallEnd, result: ChatResult | None) -> str | None:
        try:
            if self._watchdog is not None:
                self._watchdog.cancel()
            if self._reader is not None and not self._reader.done():
                self._reader.cancel()
            await self.upstream.aclose()
            if self.fed.first_at is not None:
                end.t_first = self.fed.first_at
            return await self._settle(end, result)
        finally:
            await self._slot.aclose()  # the sampling gate's slot: the upstream is done with this call
            self._done.set()
            # Settled: nothing reads the upstream or the call's state again. mitmproxy's flow, which holds
            # this object, sits in reference cycles and lives until a full garbage collection; without
            # these references the request (every message of an agent's history, parsed), its prompt ids
            # and the parsed answer go now, by reference counting, instead of riding along to be walked
            # by every collection until then (py-spy: a growing share of CPU at agent-sized histories).
            del self.upstream, self._settle

    def _sent(self, data: bytes) -> bytes:
        self.sent.append(data)
        return data


_END = object()  # the upstream's stream ended
_SILENCE = object()  # nothing went out for keepalive_s
_QUEUED_CHUNKS = 4096  # upstream chunks read ahead of a slow client before reading pauses (backpressure)


async def _read_into(source: UpstreamStream, queue: asyncio.Queue) -> None:
    """Every upstream chunk's deltas into the queue, then _END, or the exception that broke the stream."""
    try:
        async for deltas in source:
            await queue.put(deltas)
        await queue.put(_END)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 — handed to the body, which answers with the provider's error
        await queue.put(exc)
