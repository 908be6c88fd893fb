"""The HTTP client polar uses toward vLLM, and how its failures become GatewayErrors.

The transport is polar/upstream/h1.py (pooled HTTP/1.1 keep-alive, httptools' parser): on the per-call
path a general client cost more than polar's own work (aiohttp about twice h1's CPU a small call,
scripts/bench_upstream_client.py; httpx more than aiohttp).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from polar.errors import GatewayError
from polar.json_values import compact
from polar.upstream.h1 import Answer, Pool, UpstreamConnectError
from polar.upstream.stall import Stall

_CONTEXT_MARKERS = ("maximum context length", "context length", "too long", "max_model_len", "maximum model length")


def response_json(raw: bytes | str) -> Any:
    """An upstream's JSON answer or stream chunk. A chat-mode chunk carries the whole prompt's ids (100k+ at
    agent size): orjson reads them ~3x faster than json, which reads what orjson refuses (NaN, -Infinity)
    and raises its ValueError on what is not JSON at all."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _body(body: Any) -> bytes | None:
    """A request's JSON body as bytes. A token-in prompt is the whole context as ids, re-sent every turn:
    compact writes them (numpy arrays included) in one pass."""
    return None if body is None else compact(body)


@dataclass
class OpenStream:
    """A streaming answer the upstream has begun (status < 400): its body is read with `sse_batches`."""

    url: str
    answer: Answer
    read_timeout: float  # the longest silence between two pieces of the stream
    stall: Stall | None = None  # a shorter silence, past which the upstream's health probe decides (stall.py)

    async def read(self) -> bytes:
        return await (self.stall.read(self.answer, self.read_timeout) if self.stall
                      else self.answer.read(self.read_timeout))

    def close(self) -> None:
        self.answer.close()  # unread: its connection closes, and vLLM stops sampling it


class UpstreamHTTP:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0, max_connections: int = 1024,
                 stall: float = 0.0):
        self.base_url = base_url.rstrip("/")
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        # `stall` seconds without a byte: the upstream's health probe tells a busy server from a stalled one.
        self.stall = Stall(self.base_url, stall, self._headers) if stall else None
        self._max_connections = max_connections
        Pool(self.base_url, headers=self._headers)  # a base URL or key polar cannot send fails now, not per call
        self._pool: Pool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _client(self) -> Pool:
        # Made lazily, one per event loop: its connections belong to the loop that opened them.
        if self._closed:  # closed for good: nothing is sent upstream again
            raise _stopped()
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool_loop is not loop:
            self._pool = Pool(self.base_url, limit=self._max_connections, connect_timeout=10.0, headers=self._headers)
            self._pool_loop = loop
        return self._pool

    async def aclose(self) -> None:
        """Close for good (polar is stopping, or this backend was replaced): calls still waiting fail as
        `stopping`, and nothing is sent upstream again."""
        self._closed = True
        if self._pool is not None and self._pool_loop is asyncio.get_running_loop():
            await self._pool.close()

    async def status(self, method: str, path: str, body: Any = None) -> int | None:
        """Just the status code of a call (None when unreachable) — for probing endpoints."""
        try:
            status, _ = await self._client().fetch(method, path, _body(body), self.timeout)
            return status
        except (TimeoutError, OSError):
            return None

    async def call(self, method: str, path: str, body: Any = None, read: Callable[[bytes], Any] = response_json) -> Any:
        """`read`: how a successful answer's body is parsed (an error's is always read as plain JSON)."""
        url = self.base_url + path
        try:
            # A pooled connection the server closed as we wrote is retried once by the pool (nothing was answered).
            fetch = self._client().fetch(method, path, _body(body), self.timeout)
            status, raw = await (self.stall.watch(fetch) if self.stall else fetch)
        except (TimeoutError, OSError) as exc:
            raise self._failure(url, exc) from None
        try:
            data = read(raw) if status < 400 else response_json(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            snippet = raw[:200].decode(errors="replace") if raw else "<empty body>"
            raise GatewayError(
                "upstream_error", f"the upstream {url} answered {status} with a body that is not JSON: {snippet!r}"
            ) from None
        if status >= 400:
            raise status_error(status, data, url)
        return data

    async def open_stream(self, path: str, body: Any) -> OpenStream:
        """POST a streaming request and return the stream once its status is in (vLLM sends it with the first
        token: the wait is bounded as any silence is). An error status becomes the same GatewayError `call`
        raises, so the client gets a plain error answer."""
        url = self.base_url + path
        try:
            async with asyncio.timeout(self.timeout):
                opened = self._client().open("POST", path, _body(body))
                answer = await (self.stall.watch(opened, Answer.close) if self.stall else opened)
                if answer.status < 400:
                    return OpenStream(url, answer, self.timeout, self.stall)
                try:
                    raw = await answer.body()
                finally:
                    answer.close()
        except (TimeoutError, OSError) as exc:
            raise self._failure(url, exc) from None
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = raw[:200].decode(errors="replace")
        raise status_error(answer.status, data, url)

    def _failure(self, url: str, exc: BaseException) -> GatewayError:
        """What a failed upstream request tells the client (and its row)."""
        if self._closed:
            return _stopped()
        if isinstance(exc, TimeoutError):
            return GatewayError("upstream_timeout", f"the upstream {url} did not answer in time")
        if isinstance(exc, UpstreamConnectError):
            return GatewayError("upstream_unavailable", f"cannot connect to the upstream {url}: {exc}")
        return GatewayError("upstream_error", f"the upstream {url} broke off: {type(exc).__name__}: {exc}")  # reset, protocol


def _stopped() -> GatewayError:
    return GatewayError("stopping", "polar was stopped while this call waited upstream; retry the call")


def status_error(status: int, data: Any, url: str) -> GatewayError:
    message = _error_message(data)
    if status in (400, 413, 422) and any(m in message.lower() for m in _CONTEXT_MARKERS):
        return GatewayError("context_length", f"the prompt is too long for the model: {message}")
    if status in (400, 422):
        return GatewayError("invalid_request", f"the upstream rejected the request: {message}")
    if status == 429:
        return GatewayError("rate_limit", f"the upstream is rate limiting: {message}")
    if status == 503:
        return GatewayError("upstream_unavailable", f"the upstream is unavailable: {message}")
    return GatewayError("upstream_error", f"the upstream {url} answered {status}: {message}")


def _error_message(data: Any) -> str:
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(data.get("message"), str):
            return data["message"]
    return json.dumps(data)[:300]


class StreamRequest:
    """A streaming POST in flight. vLLM's server sends a stream's headers only with its first chunk, that is
    after queueing and prefill, so the request runs as a task: the gateway can wait a while for it to be
    accepted (its errors then are plain error answers) and otherwise start the client's stream meanwhile."""

    def __init__(self, http: UpstreamHTTP, path: str, body: Any):
        self.url = http.base_url + path
        self._task = asyncio.ensure_future(http.open_stream(path, body))

    async def accepted(self, timeout: float | None) -> bool:
        """True once the upstream answered with a stream, False while it still works on it; its refusal raises."""
        done, _ = await asyncio.wait({self._task}, timeout=timeout)
        if done:
            self._task.result()
        return bool(done)

    async def batches(self) -> AsyncIterator[list[str]]:
        """The stream's `data:` payloads as they arrive, a list per read (waiting for the upstream to answer first)."""
        async for batch in sse_batches(await self._task):
            yield batch

    def close(self) -> None:
        """Drop the request, answered or not: vLLM aborts a request whose client goes (the GPU is freed)."""
        if not self._task.done():
            self._task.cancel()
        elif not self._task.cancelled() and self._task.exception() is None:
            self._task.result().close()


async def sse_batches(resp: OpenStream) -> AsyncIterator[list[str]]:
    """The `data:` payloads of an upstream SSE body, one per line, in lists of what each read brought.

    vLLM writes one `data: …` line per event, one event per sampled token; when the loop is busy (many
    streams) one read brings many, and the reader takes them in one go (one decode, one parse, one
    rendered event) rather than one by one. Failures mid-stream become GatewayErrors, after the whole
    lines that arrived before the failure (a busy loop may not have read them yet); a cut-off event is
    no event.
    """
    lines = _Lines()
    try:
        while block := await resp.read():
            if batch := lines.feed(block):
                yield batch
    except TimeoutError:
        raise GatewayError("upstream_timeout", f"the upstream {resp.url} went silent mid-stream") from None
    except OSError as exc:
        raise GatewayError("upstream_error",
                           f"the upstream {resp.url} broke off mid-stream: {type(exc).__name__}: {exc}") from None
    if batch := lines.feed(b"\n"):
        yield batch


def take_batch(batch: list[str], take: Callable[[str], Any], url: str, what: str) -> tuple[list[Any], GatewayError | None, bool]:
    """The payloads of one read, each through `take`, up to `[DONE]` or the first that fails: (what they gave,
    that failure as an upstream_error, whether `[DONE]` came). What came before a failure is still given."""
    out: list[Any] = []
    for data in batch:
        if data == "[DONE]":
            return out, None, True
        try:
            out.append(take(data))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            return out, GatewayError("upstream_error", f"the upstream {url} sent a stream chunk that is not {what} "
                                                       f"({type(exc).__name__}: {exc})"), False
        except GatewayError as exc:
            return out, exc, False
    return out, None, False


class _Lines:
    """Splits blocks of an SSE body into `data:` payloads, holding back a line not yet ended."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []

    def feed(self, block: bytes) -> list[str]:
        out, start = [], 0
        while (end := block.find(b"\n", start)) >= 0:
            line = b"".join([*self._pending, block[start:end]]) if self._pending else block[start:end]
            self._pending.clear()
            start = end + 1
            if line.startswith(b"data:"):
                out.append(line[5:].strip().decode())
        if start < len(block):
            self._pending.append(block[start:])
        return out
