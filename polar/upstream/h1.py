"""HTTP/1.1 to the upstream: pooled keep-alive connections, each answer parsed by httptools (llhttp).

polar talks to one upstream (vLLM's OpenAI-compatible server, uvicorn), over HTTP/1.1, with JSON bodies
and SSE streams, on every model call. A general client costs that path more than its own work: aiohttp's
request machinery (URL and header objects, cookie jar, tracing, connector futures) takes about twice this
client's CPU a call (scripts/bench_upstream_client.py measures both; docs/benchmarks.md). What a general client gives
and polar needs is kept: a connection limit, keep-alive reuse below the server's own idle
timeout, one retry when a reused connection turns out closed before any answer, connect and total
timeouts, a stream's silence bounded, flow control, and a request abandoned mid-answer closing its
connection (vLLM aborts a request whose client goes, freeing the GPU).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

# Below uvicorn's (and so vLLM's) 5 s keep-alive: never reuse a socket the server is about to close.
KEEPALIVE_S = 3.0
# A stream's unread bytes past which the socket is no longer read (resumed once they are taken).
STREAM_BUFFER = 1 << 20
HEAD_LIMIT = 64 * 1024  # a status line and headers longer than this are not an upstream's answer


class UpstreamConnectError(OSError):
    """No connection to the upstream (refused, unresolvable, TLS, or not within the connect timeout)."""


class UpstreamClosed(ConnectionError):
    """The connection ended before any byte of the answer: the upstream read nothing of it, or crashed."""

    def __init__(self, message: str, reused: bool):
        super().__init__(message)
        self.reused = reused  # a pooled connection the server had closed: one retry cannot duplicate an answer


class UpstreamBroken(ConnectionError):
    """The connection ended, or its bytes stopped being HTTP, partway through the answer."""


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host and port to connect to, the base URL's path before every request path."""

    scheme: str
    host: str
    port: int
    prefix: str
    netloc: str

    @classmethod
    def of(cls, base_url: str) -> Origin:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the upstream must be an http:// or https:// URL, not {base_url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"), parts.netloc)


class Answer:
    """One response as it arrives: its status and head, then its body, whole or in pieces (a stream)."""

    def __init__(self, conn: _Connection):
        loop = asyncio.get_running_loop()
        self._conn = conn
        self.head: asyncio.Future[int] = loop.create_future()  # the status code, once the head is in
        self.status = 0
        self._pieces: deque[bytes] = deque()
        self._buffered = 0
        self._error: BaseException | None = None
        self.complete = False  # the whole body has arrived
        self._waiter: asyncio.Future[None] | None = None
        self.started = False  # a byte of the answer has arrived
        self.keep_alive = False
        self._delimited = False  # the body ends where the connection does (no length, not chunked)

    # -- what the connection feeds ------------------------------------------------------

    def headers_done(self, status: int, keep_alive: bool, delimited: bool) -> None:
        self.status, self.keep_alive, self._delimited = status, keep_alive, delimited
        if not self.head.done():
            self.head.set_result(status)

    def piece(self, data: bytes) -> None:
        self._pieces.append(data)
        self._buffered += len(data)
        if self._buffered > STREAM_BUFFER:
            self._conn.pause()
        self._wake()

    def finished(self) -> None:
        self.complete = True
        self._wake()

    def ended(self, exc: BaseException | None) -> None:
        """The connection is gone: the answer ends here — whole when its body runs to the close, else broken."""
        if self.complete:
            return
        if self._delimited and exc is None:
            self.finished()
            return
        if not self.started:
            error: BaseException = UpstreamClosed(
                "the upstream closed the connection before answering" + (f" ({exc})" if exc else ""), self._conn.reused)
        else:
            error = UpstreamBroken("the connection closed mid-answer" + (f" ({exc})" if exc else ""))
        self.fail(error)

    def fail(self, error: BaseException) -> None:
        if self._error is None and not self.complete:
            self._error = error
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved here: a caller that stopped waiting leaves no warning behind
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- what the caller reads ----------------------------------------------------------

    async def read(self, timeout: float | None = None) -> bytes:
        """The body bytes that arrived since the last read (waiting up to `timeout` for some); b"" once the
        body has ended. Bytes that arrived before a failure are read before it is raised."""
        while not self._pieces:
            if self.complete:
                self._conn.answered(self)
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._waiter
            finally:
                self._waiter = None
        data = self._pieces.popleft() if len(self._pieces) == 1 else b"".join(self._pieces)
        self._pieces.clear()
        self._buffered = 0
        self._conn.resume()
        return data

    async def body(self) -> bytes:
        """The whole body (waiting for it all)."""
        parts = []
        while piece := await self.read():
            parts.append(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def unread(self) -> bytes:
        """What has arrived and not been read (the last bytes of a stream that broke)."""
        return b"".join(self._pieces)

    def close(self) -> None:
        """Done with this answer: a whole one that was read gives its connection back; any other closes it (an
        upstream that streams to a client who left stops sampling)."""
        self._conn.answered(self)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self, pool: Pool):
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None
        self.reused = False  # taken from the pool for this request (not opened for it)
        self.lost = False
        self.idle_since = 0.0
        self._head_bytes = self._unheaded = 0  # header bytes parsed; bytes read before the head ended
        self._oversized = False
        self._framed = False  # the answer's head gave a length or chunked coding
        self._began = self._interim = self._stray = False  # an answer began; it is a 1xx; more than one came
        self._paused = False

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # bytes nobody asked for: this connection can no longer be trusted
            self._drop()
            return
        answer.started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            answer.fail(UpstreamBroken(f"the upstream's answer is not HTTP/1.1 ({exc})"))
            self._drop()
            return
        if not answer.head.done():
            self._unheaded += len(data)  # bytes read with no head yet: one that does not end is no answer
        if self._oversized or self._unheaded > HEAD_LIMIT:
            answer.fail(UpstreamBroken(f"the upstream's answer head is over {HEAD_LIMIT} bytes"))
            self._drop()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._pool.forget(self)
        if self.answer is not None:
            self.answer.ended(exc)

    # -- httptools callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._framed = False
        if self._began and not self._interim:  # a second answer to one request: the stream is out of step
            self._stray = True
        self._began = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        self._interim = 100 <= status < 200  # "100 Continue" and the like: the answer follows
        if self._head_bytes > HEAD_LIMIT:
            self._oversized = True  # data_received fails the answer and drops the connection
        elif self.answer is not None and not self._interim and not self._stray:
            self.answer.headers_done(status, self._parser.should_keep_alive(), delimited=not self._framed)

    def on_body(self, body: bytes) -> None:
        if self.answer is not None and not self._stray:
            self.answer.piece(body)

    def on_message_complete(self) -> None:
        if self.answer is None or self._interim:
            return
        if self._stray:
            self.answer.keep_alive = False  # never reused
            return
        self.answer.keep_alive = self.answer.keep_alive and self._parser.should_keep_alive()
        self.answer.finished()

    # -- the request --------------------------------------------------------------------

    def send(self, head: bytes, body: bytes | None) -> Answer:
        self.answer = answer = Answer(self)
        self._head_bytes = self._unheaded = 0
        self._began = self._interim = self._stray = self._oversized = False
        assert self.transport is not None
        self.transport.writelines([head, body] if body else [head])
        return answer

    def answered(self, answer: Answer) -> None:
        """The caller is done with `answer`: back to the pool when it was whole and read, else closed."""
        if self.answer is not answer:
            return
        self.answer = None
        self.resume()
        if answer.complete and answer.keep_alive and not answer.unread() and not self.lost:
            self._pool.release(self)
        else:
            self._drop()

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.lost:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.lost:
            self._paused = False
            self.transport.resume_reading()

    def _drop(self) -> None:
        self._pool.forget(self)
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Keep-alive connections to one origin, at most `limit` open at once (further requests wait for one)."""

    def __init__(self, base_url: str, limit: int = 1024, connect_timeout: float = 10.0,
                 headers: dict[str, str] | None = None, keepalive_s: float = KEEPALIVE_S):
        self.origin = Origin.of(base_url)
        self.connect_timeout, self.keepalive_s = connect_timeout, keepalive_s
        fixed = {"host": self.origin.netloc, "user-agent": "polar", **(headers or {})}
        if any(c in text for item in fixed.items() for text in item for c in "\r\n\0"):
            raise ValueError("an upstream header name or value holds a line break or NUL")
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self.limit = limit
        self._idle: list[_Connection] = []  # newest last
        self._open: set[_Connection | _Connecting] = set()
        self._waiting: deque[asyncio.Future[_Connection | None]] = deque()  # requests waiting for a place
        self._ssl = ssl.create_default_context() if self.origin.scheme == "https" else None
        self.closed = False

    async def fetch(self, method: str, path: str, body: bytes | None, timeout: float | None) -> tuple[int, bytes]:
        """One whole answer: (status, body). Within `timeout` seconds in all, or TimeoutError (the connection
        is closed, so the upstream stops working on it)."""
        async with asyncio.timeout(timeout):
            answer = await self.open(method, path, body)
            try:
                return await answer.head, await answer.body()
            finally:
                answer.close()

    async def open(self, method: str, path: str, body: bytes | None) -> Answer:
        """Send a request; the answer once its status is in (`await answer.head`) — the body is read from it."""
        head = self._head(method, path, body)
        for attempt in (0, 1):
            conn = await self._connection()
            answer = conn.send(head, body)
            try:
                await answer.head
                return answer
            except UpstreamClosed as exc:
                answer.close()
                if not exc.reused or attempt:  # a fresh connection refused it: that is the upstream's answer
                    raise
            except BaseException:  # cancelled, timed out, broken: the connection goes with the request
                answer.close()
                raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self.closed = True
        for conn in list(self._open):
            if isinstance(conn, _Connection):
                conn._drop()
        await asyncio.sleep(0)  # let the transports close

    # -- connections --------------------------------------------------------------------

    def _head(self, method: str, path: str, body: bytes | None) -> bytes:
        length = f"content-type: application/json\r\ncontent-length: {len(body)}\r\n" if body is not None else ""
        return f"{method} {self.origin.prefix}{path} HTTP/1.1\r\n{self._fixed}{length}\r\n".encode("latin-1")

    async def _connection(self) -> _Connection:
        """An idle connection, or a new one while fewer than `limit` are open, or the first to come free."""
        while True:
            now = time.monotonic()
            while self._idle:
                conn = self._idle.pop()
                if not conn.lost and now - conn.idle_since < self.keepalive_s:
                    conn.reused = True
                    return conn
                conn._drop()
            if len(self._open) < self.limit:
                return await self._connect()
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                conn = await waiter
            except BaseException:  # gave up (cancelled, timed out) as a place was handed over: the next one takes it
                if waiter.done() and not waiter.cancelled():
                    self.release(waiter.result()) if waiter.result() is not None else self._hand_place()
                raise
            finally:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
            if conn is not None:
                conn.reused = True
                return conn

    async def _connect(self) -> _Connection:
        placeholder = _Connecting()
        self._open.add(placeholder)  # counts against the limit while it connects
        try:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self), self.origin.host, self.origin.port, ssl=self._ssl,
                    server_hostname=self.origin.host if self._ssl else None)
        except BaseException as exc:
            self.forget(placeholder)
            if isinstance(exc, TimeoutError):
                raise UpstreamConnectError(f"no connection within {self.connect_timeout:g} s") from None
            if isinstance(exc, OSError):
                raise UpstreamConnectError(str(exc) or type(exc).__name__) from None
            raise
        self._open.discard(placeholder)
        self._open.add(conn)  # its place, taken over
        if self.closed:  # closed while it connected
            conn._drop()
            raise UpstreamConnectError("the client was closed")
        return conn

    def release(self, conn: _Connection) -> None:
        """A connection whose answer was read whole: to the first request waiting for one, else idle."""
        if self.closed:
            conn._drop()
            return
        conn.reused, conn.idle_since = False, time.monotonic()
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def forget(self, conn: _Connection | _Connecting) -> None:
        """`conn` is closing (or failed to open): its place is free for a request waiting for one."""
        if conn in self._open:
            self._open.discard(conn)
            self._hand_place()
        if conn in self._idle:
            self._idle.remove(conn)

    def _hand_place(self) -> None:
        """A place under the limit is free: the first request waiting opens a connection in it."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class _Connecting:
    """A connection being opened: it holds its place under the limit."""
