"""polar/upstream/http.py reading an upstream's SSE stream over a real loopback connection (aiohttp server)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from polar.errors import GatewayError
from polar.upstream.http import UpstreamHTTP, sse_batches
from tests.support.aiohttp_server import serving

EVENTS = [b'data: {"n": %d}\n\n' % i for i in range(3)]


async def _served(handler, body_check):
    async with serving("/stream", handler) as url:
        http = UpstreamHTTP(url)
        try:
            return await body_check(http)
        finally:
            await http.aclose()


async def _read(http: UpstreamHTTP, wait: float) -> tuple[list[str], GatewayError | None]:
    resp = await http.open_stream("/stream", {})
    await asyncio.sleep(wait)  # a busy event loop: the stream's bytes and its end arrive before polar reads
    got: list[str] = []
    try:
        async for batch in sse_batches(resp):
            got += batch
    except GatewayError as exc:
        return got, exc
    return got, None


def test_events_sent_before_the_upstream_dies_are_read_even_when_read_late():
    """vLLM dies after three events (the chunked body is cut, no [DONE]); aiohttp has them buffered but
    raises on its next read. They are still delivered, then the upstream_error."""

    async def dying(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in EVENTS:
            await resp.write(event)
        await resp.write(b'data: {"n": 3, "cut')  # half an event: not delivered
        await asyncio.sleep(0.05)
        request.transport.close()  # the process dies: the connection closes mid-body
        await asyncio.sleep(1)
        return resp

    got, error = asyncio.run(_served(dying, lambda http: _read(http, wait=0.3)))
    assert got == ['{"n": 0}', '{"n": 1}', '{"n": 2}']
    assert error is not None and error.kind == "upstream_error" and "broke off mid-stream" in str(error)


@pytest.mark.parametrize("tail", [b"", b"\n"], ids=["no-final-newline", "final-newline"])
def test_a_stream_that_ends_cleanly_gives_every_event(tail):
    async def whole(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in EVENTS:
            await resp.write(event)
        await resp.write(b"data: [DONE]" + tail)
        await resp.write_eof()
        return resp

    got, error = asyncio.run(_served(whole, lambda http: _read(http, wait=0.1)))
    assert error is None and got == ['{"n": 0}', '{"n": 1}', '{"n": 2}', "[DONE]"]
