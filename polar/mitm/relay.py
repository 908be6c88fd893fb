"""The loopback relay streamed answers leave through.

mitmproxy sends a body an addon makes in one piece, but it streams a body that comes from a server.
So a flow whose answer streams is pointed at this small server on 127.0.0.1 (`hand_over`): mitmproxy
forwards the (emptied) request to it, gets the answer's headers at once and, with
`flow.response.stream`, passes each chunk to the client the moment the gateway renders it. The flow
stays an ordinary mitmweb flow; `restore` puts the client's own request back on it for display.

A flow is matched to its stream by a one-time token header, so nothing else on the host can read
a stream. When the client goes away mid-stream mitmproxy drops this connection: aiohttp cancels the
handler and the stream is abandoned (the upstream request aborted, the partial turn kept). A stream
nobody comes to read within `claim_s` is abandoned the same way.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass

from aiohttp import web
from mitmproxy import http

from polar.gateway.streaming import StreamReply
from polar.mitm.flows import comment

log = logging.getLogger("polar.relay")

TOKEN_HEADER = "x-polar-relay"


@dataclass
class _Original:
    """The client's request as it came, put back on the flow once the relay has it."""

    scheme: str
    host: str
    port: int
    authority: str
    headers: http.Headers
    content: bytes | None


class RelayAddon:
    """The relay's side of each flow: a relayed flow streams its answer and shows the client's own request."""

    def __init__(self, relay: StreamRelay | None = None) -> None:
        self.relay = relay or StreamRelay()

    def running(self) -> None:
        from mitmproxy import ctx

        # Keep streamed answers on their flows, so mitmweb shows them like any other answer.
        if "store_streamed_bodies" in ctx.options and not ctx.options.store_streamed_bodies:
            ctx.options.update(store_streamed_bodies=True)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if self.relay.relayed(flow) is not None:
            self.relay.restore(flow)  # the request the client sent, for mitmweb
            flow.response.headers.pop("server", None)  # the relay's own; the client sees the gateway's headers
            flow.response.stream = True

    def response(self, flow: http.HTTPFlow) -> None:
        if self.relay.relayed(flow) is not None:
            comment(flow)  # the stream has ended: its token counts are known

    def error(self, flow: http.HTTPFlow) -> None:
        self.relay.client_gone(flow)  # a stream whose client went away: abort upstream, keep what was sampled


class StreamRelay:
    def __init__(self, claim_s: float = 60.0):
        self.claim_s = claim_s
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._waiting: dict[str, StreamReply] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            if self._runner is not None:
                return
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._serve)
            # handler_cancellation: a dropped connection cancels its handler at once, even while it waits upstream.
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 — aiohttp exposes no bound port
            self._runner = runner

    async def stop(self) -> None:
        for reply in self._waiting.values():
            reply.call.abandon()
        self._waiting.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- the mitmproxy side ------------------------------------------------------------------

    async def hand_over(self, flow: http.HTTPFlow, reply: StreamReply) -> None:
        """Point the flow at the relay; mitmproxy then fetches the stream from it."""
        await self.start()
        token = secrets.token_urlsafe(18)
        self._waiting[token] = reply
        asyncio.get_running_loop().call_later(self.claim_s, self._expire, token)
        req = flow.request
        original = _Original(req.scheme, req.host, req.port, req.authority, req.headers.copy(), req.raw_content)
        flow.metadata["polar_relay"] = (reply, original)
        req.scheme, req.host, req.port = "http", "127.0.0.1", self.port
        req.headers[TOKEN_HEADER] = token
        req.content = b""  # the gateway has read it; the relay needs only the token

    @staticmethod
    def relayed(flow: http.HTTPFlow) -> StreamReply | None:
        held = flow.metadata.get("polar_relay")
        return held[0] if held else None

    @staticmethod
    def restore(flow: http.HTTPFlow) -> None:
        """The client's own request back on the flow (it has been sent to the relay by now)."""
        held = flow.metadata.get("polar_relay")
        if held is None or held[1] is None:
            return
        original = held[1]
        req = flow.request
        req.scheme, req.host, req.port = original.scheme, original.host, original.port
        req.authority, req.headers, req.raw_content = original.authority, original.headers, original.content
        flow.metadata["polar_relay"] = (held[0], None)

    def client_gone(self, flow: http.HTTPFlow) -> None:
        if (reply := self.relayed(flow)) is not None:
            reply.call.abandon()

    def _expire(self, token: str) -> None:
        reply = self._waiting.pop(token, None)
        if reply is not None:
            log.warning("a streamed answer was not fetched within %.0f s; its upstream request is aborted", self.claim_s)
            reply.call.abandon()

    # -- the relay server ----------------------------------------------------------------------

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        reply = self._waiting.pop(request.headers.get(TOKEN_HEADER, ""), None)
        if reply is None:
            return web.Response(status=404, text="no such stream\n")
        try:
            refused = await reply.call.begin()  # the upstream queues and prefills while mitmproxy connected here
        except asyncio.CancelledError:
            reply.call.abandon()
            raise
        if refused is not None:
            return web.Response(status=refused.status, body=refused.body, headers=refused.headers)
        response = web.StreamResponse(status=reply.status, headers=reply.headers)
        body = reply.call.chunks()
        try:
            await response.prepare(request)
            async for chunk in body:
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):  # the client (through mitmproxy) went away
            reply.call.abandon()
            raise
        finally:
            await body.aclose()
        return response
