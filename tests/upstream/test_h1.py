"""polar/upstream/h1.py against real loopback servers that send exactly the bytes each case needs:
keep-alive reuse and its one retry, framing (length, chunked, to the close), hostile or broken answers,
timeouts and abandoned requests closing their connection, the connection limit, flow control."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from polar.upstream.h1 import STREAM_BUFFER, Pool, UpstreamBroken, UpstreamClosed, UpstreamConnectError

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


class Server:
    """A raw TCP server on loopback: each connection is handed to `handler`; counts what it saw."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.closed_by_client = asyncio.Event()
        self.requests: list[bytes] = []

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """One request, head and body (by its content-length)."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body

    async def wait_closed_by_client(self, reader: asyncio.StreamReader) -> None:
        if await reader.read(1) == b"":
            self.closed_by_client.set()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


async def keep_alive(reader, writer, server):
    while True:
        await server.request(reader)
        writer.write(OK)


def test_sequential_calls_reuse_one_connection_and_send_a_well_formed_request():
    async def go():
        async with Server(keep_alive) as server:
            pool = Pool(server.url + "/base/", headers={"authorization": "Bearer k"})
            for _ in range(5):
                assert await pool.fetch("POST", "/v1/chat/completions", b'{"a": 1}', 5) == (200, b"{}")
            await pool.close()
            return server

    server = run(go())
    assert server.connections == 1
    head = server.requests[0]
    assert head.startswith(b"POST /base/v1/chat/completions HTTP/1.1\r\n")
    assert b"authorization: Bearer k\r\n" in head and b"content-length: 8\r\n" in head and head.endswith(b'{"a": 1}')
    assert b"host: 127.0.0.1:" in head


def test_a_pooled_connection_the_server_closed_is_retried_once_on_a_fresh_one():
    async def answer_once(reader, writer, server):
        await server.request(reader)
        writer.write(OK)  # keep-alive by HTTP/1.1's default, then the server closes it anyway
        await writer.drain()

    async def go():
        async with Server(answer_once) as server:
            pool = Pool(server.url)
            assert await pool.fetch("POST", "/x", b"{}", 5) == (200, b"{}")
            await asyncio.sleep(0.05)  # the close has not necessarily been seen: the pool may still hold it
            assert await pool.fetch("POST", "/x", b"{}", 5) == (200, b"{}")
            await pool.close()
            return server.connections

    assert run(go()) == 2


def test_a_fresh_connection_closed_without_an_answer_is_an_error_not_a_retry():
    async def hang_up(reader, writer, server):
        await server.request(reader)

    async def go():
        async with Server(hang_up) as server:
            pool = Pool(server.url)
            with pytest.raises(UpstreamClosed) as err:
                await pool.fetch("POST", "/x", b"{}", 5)
            await pool.close()
            return err.value, server.connections

    err, connections = run(go())
    assert not err.reused and connections == 1


@pytest.mark.parametrize("answer,body", [
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n", b"abcdefg"),
    (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nto the end", b"to the end"),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", b"ok"),
], ids=["chunked", "close-delimited", "interim-100"])
def test_bodies_framed_every_way_http_allows(answer, body):
    async def send(reader, writer, server):
        await server.request(reader)
        writer.write(answer)
        await writer.drain()
        if b"connection: close" in answer:
            writer.close()
        else:
            await server.request(reader)

    async def go():
        async with Server(send) as server:
            pool = Pool(server.url)
            got = await pool.fetch("POST", "/x", b"{}", 5)
            await pool.close()
            return got

    assert run(go()) == (200, body)


@pytest.mark.parametrize("answer,what", [
    (b"HTTP/1.1 2x0 OK\r\n\r\n", "not HTTP/1.1"),
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not HTTP/1.1"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nab", "not HTTP/1.1"),
    (b"HTTP/1.1 200 OK\r\n" + b"x-filler: " + b"a" * 70_000 + b"\r\n\r\n", "head is over"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "not HTTP/1.1"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", "mid-answer"),
], ids=["bad-status", "not-http", "two-lengths", "huge-head", "bad-chunk", "cut-body"])
def test_hostile_or_broken_answers_fail_clearly(answer, what):
    async def send(reader, writer, server):
        await server.request(reader)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(0.05)

    async def go():
        async with Server(send) as server:
            pool = Pool(server.url)
            with pytest.raises(UpstreamBroken) as err:
                await pool.fetch("POST", "/x", b"{}", 5)
            await pool.close()
            return str(err.value)

    assert what in run(go())


def test_stray_bytes_after_an_answer_keep_its_connection_out_of_the_pool():
    async def send(reader, writer, server):
        while True:
            await server.request(reader)
            writer.write(OK + b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray")  # two answers to one request

    async def go():
        async with Server(send) as server:
            pool = Pool(server.url)
            assert await pool.fetch("POST", "/x", b"{}", 5) == (200, b"{}")
            assert await pool.fetch("POST", "/x", b"{}", 5) == (200, b"{}")
            await pool.close()
            return server.connections

    assert run(go()) == 2


def test_a_call_past_its_timeout_closes_its_connection():
    """The upstream stops working on a request whose client left (vLLM aborts it): the connection closes."""

    async def silent(reader, writer, server):
        await server.request(reader)
        await server.wait_closed_by_client(reader)

    async def go():
        async with Server(silent) as server:
            pool = Pool(server.url)
            with pytest.raises(TimeoutError):
                await pool.fetch("POST", "/x", b"{}", 0.2)
            await asyncio.wait_for(server.closed_by_client.wait(), 5)
            await pool.close()

    run(go())


def test_a_stream_abandoned_midway_closes_its_connection_and_gives_what_came_before_a_break():
    async def stream(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await server.wait_closed_by_client(reader)

    async def dies(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nlast\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()  # the upstream process dies: a reset mid-body

    async def go():
        async with Server(stream) as server:
            pool = Pool(server.url)
            answer = await pool.open("POST", "/x", b"{}")
            assert answer.status == 200 and await answer.read(5) == b"first"
            answer.close()  # the client left
            await asyncio.wait_for(server.closed_by_client.wait(), 5)
            await pool.close()
        async with Server(dies) as server:
            pool = Pool(server.url)
            answer = await pool.open("POST", "/x", b"{}")
            await asyncio.sleep(0.2)  # read late: the bytes and the reset have both arrived
            assert await answer.read(5) == b"last"
            with pytest.raises(UpstreamBroken):
                await answer.read(5)
            await pool.close()

    run(go())


def test_a_silent_stream_times_out_between_pieces():
    async def stalls(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def go():
        async with Server(stalls) as server:
            pool = Pool(server.url)
            answer = await pool.open("POST", "/x", b"{}")
            assert await answer.read(2) == b"a"
            with pytest.raises(TimeoutError):
                await answer.read(0.2)
            answer.close()
            await pool.close()

    run(go())


def test_the_connection_limit_holds_and_waiting_requests_go_on_freed_connections():
    async def slow(reader, writer, server):
        while True:
            await server.request(reader)
            await asyncio.sleep(0.05)
            writer.write(OK)

    async def go():
        async with Server(slow) as server:
            pool = Pool(server.url, limit=2)
            got = await asyncio.gather(*(pool.fetch("POST", "/x", b"{}", 10) for _ in range(7)))
            await pool.close()
            return got, server.most_open, server.connections

    got, most_open, connections = run(go())
    assert got == [(200, b"{}")] * 7 and most_open <= 2 and connections == 2


def test_a_fast_stream_read_slowly_is_held_to_its_buffer():
    piece = b"x" * 65536

    async def flood(reader, writer, server):
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(128):  # 8 MB
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def go():
        async with Server(flood) as server:
            pool = Pool(server.url)
            answer = await pool.open("POST", "/x", b"{}")
            total, most = 0, 0
            while True:
                await asyncio.sleep(0.002)
                most = max(most, len(answer.unread()))
                data = await answer.read(5)
                if not data:
                    break
                total += len(data)
            await pool.close()
            return total, most

    total, most = run(go())
    assert total == 128 * len(piece) and most <= STREAM_BUFFER + 4 * len(piece)


def test_no_upstream_listening_is_a_connect_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def go():
        pool = Pool(f"http://127.0.0.1:{port}")
        with pytest.raises(UpstreamConnectError):
            await pool.fetch("GET", "/v1/models", None, 5)

    run(go())


@pytest.mark.parametrize("base,headers", [
    ("ftp://example.invalid", {}),
    ("http://127.0.0.1:1", {"authorization": "Bearer k\r\nx-injected: 1"}),
], ids=["scheme", "header-injection"])
def test_what_cannot_be_sent_is_refused_up_front(base, headers):
    with pytest.raises(ValueError):
        Pool(base, headers=headers)
