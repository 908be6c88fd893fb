"""The stall bound on its own (polar/upstream/stall.py), against a tiny HTTP server of the test's own on
loopback: calls silent past the bound share one health probe at a time (a busy server is not probed once per
call), are waited for while the server answers it, and fail as stalled once it does not. End to end behind a
proxy, frozen with SIGSTOP: test_fleet_stall.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from polar.errors import GatewayError
from polar.upstream.http import UpstreamHTTP


class Server:
    """Answers POST after `delay` seconds and GET /health at once — or, `frozen`, nothing at all."""

    def __init__(self, delay: float):
        self.delay, self.frozen, self.probes = delay, False, 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.closed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                length = next((int(v) for k, _, v in (line.partition(": ") for line in lines)
                               if k.lower() == "content-length"), 0)
                await reader.readexactly(length)
                if self.frozen:
                    await self.closed.wait()
                    return
                if lines[0].startswith("GET /health"):
                    self.probes += 1
                else:
                    await asyncio.sleep(self.delay)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self, listener: asyncio.Server) -> None:
        """Every connection ends (its handler returns), then the listener."""
        self.closed.set()
        for writer in self.writers:
            writer.close()
        listener.close()
        await listener.wait_closed()


async def _serve(server: Server) -> tuple[asyncio.Server, str]:
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    return listener, f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"


def test_busy_calls_share_one_probe_at_a_time_and_are_waited_for():
    async def scenario():
        server = Server(delay=1.0)
        listener, url = await _serve(server)
        http = UpstreamHTTP(url, timeout=30, stall=0.2)
        try:
            answers = await asyncio.gather(*(http.call("POST", "/v1/completions", {"n": n}) for n in range(20)))
        finally:
            await http.aclose()
            await server.close(listener)
        return answers, server.probes

    answers, probes = asyncio.run(scenario())
    assert answers == [{}] * 20
    assert 1 <= probes <= 8, probes  # a probe each 0.2 s of silence over ~1 s, shared by the 20 calls


def test_a_frozen_server_fails_the_call_as_stalled_within_the_bound_and_the_probe():
    async def scenario():
        server = Server(delay=0.0)
        listener, url = await _serve(server)
        http = UpstreamHTTP(url, timeout=30, stall=0.3)
        http.stall.probe_timeout = 0.5
        server.frozen = True
        t0 = time.monotonic()
        try:
            with pytest.raises(GatewayError) as err:
                await http.call("POST", "/v1/completions", {})
        finally:
            await http.aclose()
            await server.close(listener)
        return err.value, time.monotonic() - t0

    err, took = asyncio.run(scenario())
    assert err.kind == "upstream_timeout" and "stalled: no byte of its answer for 0.3 s" in err.message
    assert 0.8 <= took < 3, took  # the bound, then the probe's own timeout
