"""The gateway addon: builds the gateway from polar's options and hands it each HTTP flow to answer.

Configured entirely through mitmproxy options (`--set polar_upstream=…`), so `mitmdump -s
addons/polar_gateway.py`, `mitmweb -s …` and `polar proxy` run the very same addons (mitm/chain.py):
this one, the stream relay, the "polar" contentview, the drain on SIGTERM, the listen backlog and
the collector freeze. Flows carry the session, provider and token counts (`flow.metadata["polar"]`,
the flow comment) so mitmweb shows them.

An option change rebuilds only the part it touches, as mitmproxy's own addons do (each option's
part is in polar/config/options.py): the capture writer, the upstream backend (mitm/backend.py), the
backend and the sessions' prompt ids, or the live gateway's per-call settings. Calls in flight finish
on the parts they started with, which are closed once their last call is done. Registered sessions,
the sampling gate and session state survive (state is dropped only when the database or the prompt
format changes).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from mitmproxy import ctx, exceptions, http

from polar.capture import working_set
from polar.capture.writer import CaptureWriter
from polar.config.options import SPEC, add_options, check, rebuilding
from polar.errors import GatewayError
from polar.gateway.gate import SamplingGate
from polar.gateway.pipeline import Gateway, GatewayReply, GatewayRequest
from polar.gateway.streaming import StreamingCall, StreamReply
from polar.mitm.backend import build_backend
from polar.mitm.flows import comment, flow_response, gateway_headers
from polar.mitm.relay import StreamRelay
from polar.mitm.shutdown import DRAIN_OPTIONS, quiet_cancelled
from polar.providers.base import HttpReply
from polar.sessions.identity import REDACTED, SECRET_HEADERS, SessionRegistry

log = logging.getLogger("polar.addon")

WRITER_OPTIONS = rebuilding("writer")
BACKEND_OPTIONS = rebuilding("backend", "prompt")
PROMPT_OPTIONS = rebuilding("prompt")  # change the ids a session's turns hold
GATEWAY_OPTIONS = rebuilding("gateway")
# The options this addon reads: all of polar's but the drain's (mitm/shutdown.py).
OWN_OPTIONS = tuple(name for name in SPEC if name not in DRAIN_OPTIONS)


class GatewayAddon:
    def __init__(self, relay: StreamRelay | None = None) -> None:
        self.gateway: Gateway | None = None
        self.gate = SamplingGate()  # a paused trainer stays paused across option changes
        self._calls: dict[int, int] = {}  # id(gateway) → calls in flight on it (a stream until it settles)
        self._retired: list[Gateway] = []
        self.relay = relay or StreamRelay()  # where streamed answers leave (its own addon: mitm/relay.py)
        self.stopping = False  # polar is shutting down (mitm/shutdown.py): new calls are refused
        self._streams: set[StreamingCall] = set()  # streamed answers in flight, to end them when polar stops
        self._addr_header = ""  # polar_client_addr_header

    @property
    def registry(self) -> SessionRegistry | None:
        return self.gateway.registry if self.gateway else None

    def load(self, loader) -> None:
        add_options(loader, OWN_OPTIONS)

    def configure(self, updated: set[str]) -> None:
        if not updated & set(OWN_OPTIONS):
            # Another addon declaring its options as it loads: nothing of the gateway's changed. (Building here would
            # open the default database in the working directory before polar's options are set.)
            return
        opts = ctx.options
        try:
            check(opts, updated & set(OWN_OPTIONS))
        except ValueError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        self._addr_header = opts.polar_client_addr_header  # read per call: mitmproxy copies an option's value on each read
        old = self.gateway
        if old is not None and not updated & (WRITER_OPTIONS | BACKEND_OPTIONS | GATEWAY_OPTIONS):
            return
        if old is not None and not updated & (WRITER_OPTIONS | BACKEND_OPTIONS):
            self._tune(old)
            return
        same_file = old is not None and Path(opts.polar_db).resolve() == Path(old.writer.path).resolve()
        if same_file and updated & WRITER_OPTIONS:
            old.writer.tune(opts.polar_db_sync, opts.polar_db_busy_timeout)  # one writer per file
            if not updated & BACKEND_OPTIONS:
                self._tune(old)
                return
        new_db = old is None or not same_file
        writer = (CaptureWriter(opts.polar_db, synchronous=opts.polar_db_sync, busy_timeout=opts.polar_db_busy_timeout)
                  if new_db else old.writer)
        backend = build_backend(opts) if old is None or updated & BACKEND_OPTIONS else old.backend
        keep_state = old is not None and not new_db and not updated & PROMPT_OPTIONS
        # Registered keys/addresses outlive a reconfiguration; a new database brings its own salt.
        registry = old.registry if old is not None else SessionRegistry(salt=writer.key_salt)
        if old is not None and new_db:
            registry.resalt(writer.key_salt)  # runtimes hold this object: keep it, re-hash its keys
        self.gateway = Gateway(
            writer, backend, registry=registry, states=old.states if keep_state else None, gate=self.gate,
            max_body_bytes=opts.polar_max_body, model_aliases=list(opts.polar_model_aliases),
            keepalive_s=opts.polar_stream_keepalive,
        )
        self._tune(self.gateway)  # the caches sized for polar_hot_sessions
        if old is not None:
            self._retired.append(old)
            self._close_idle()

    @staticmethod
    def _tune(gateway: Gateway) -> None:
        """Options read per call: applied to the live gateway."""
        opts = ctx.options
        gateway.max_body_bytes, gateway.model_aliases = opts.polar_max_body, list(opts.polar_model_aliases)
        gateway.keepalive_s = opts.polar_stream_keepalive
        gateway.dropped_messages = opts.polar_dropped_messages
        gateway.size_caches(working_set.Budgets.for_sessions(opts.polar_hot_sessions))

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or self.gateway is None:
            return
        req = flow.request
        if self.stopping:  # not captured: nothing reached the model
            err = GatewayError("stopping", "polar is shutting down and takes no new calls; retry the call")
            reply = self.gateway.providers.guess(req.path.split("?", 1)[0], gateway_headers(req.headers)).render_error(err)
            flow.response = flow_response(HttpReply(reply.status, reply.body, {**reply.headers, "connection": "close"}))
            return
        try:
            body = req.get_content(strict=False) or b""
        except ValueError:  # undecodable content-encoding: hand over the raw bytes
            body = req.raw_content or b""
        peer = flow.client_conn.peername
        client_addr = peer[0] if peer else None
        if self._addr_header:  # behind polar's front: the peer is the front
            client_addr = req.headers.pop(self._addr_header, None) or client_addr
        headers = gateway_headers(req.headers)
        headers.setdefault("host", req.host_header or req.pretty_host)  # HTTP/2 carries :authority only
        secrets = [name for name in SECRET_HEADERS if name in headers]  # (a lookup in mitmproxy's headers is a scan)
        gateway = self.gateway
        self._calls[id(gateway)] = self._calls.get(id(gateway), 0) + 1
        path = req.path.split("?", 1)[0]
        try:
            out = await gateway.handle(
                GatewayRequest(
                    method=req.method,
                    path=path,
                    query=dict(req.query) if "?" in req.path else {},
                    headers=headers,
                    body=body,
                    client_addr=client_addr,
                )
            )
        except Exception as exc:  # a flow left without a response would go on to the upstream, uncaptured
            log.exception("polar failed on %s %s", req.method, path)
            err = GatewayError("internal", f"polar failed on this call: {type(exc).__name__}: {exc}")
            out = GatewayReply(gateway.providers.guess(path, headers).render_error(err))
        if not isinstance(out.reply, StreamReply):
            self._release(gateway)
        # The key only identified the session. mitmweb lists flows and can save them: the flow keeps
        # the headers redacted, as the capture store does (polar never sends them upstream).
        for name in secrets:
            req.headers[name] = REDACTED
        flow.metadata["polar"] = out.meta
        if isinstance(out.reply, StreamReply):  # the gateway is in use until the stream settles
            self._streams.add(out.reply.call)
            asyncio.get_running_loop().create_task(self._release_after(gateway, out.reply))
            await self.relay.hand_over(flow, out.reply)
            return
        flow.response = flow_response(out.reply)
        comment(flow)

    def _release(self, gateway: Gateway) -> None:
        self._calls[id(gateway)] -= 1
        if self._retired:
            self._close_idle()

    async def _release_after(self, gateway: Gateway, reply: StreamReply) -> None:
        try:
            await reply.call.wait_settled()
        finally:
            self._streams.discard(reply.call)
            self._release(gateway)

    def _close_idle(self) -> None:
        """Close the parts of retired gateways whose last call has finished and that nothing else uses."""
        live = [g for g in [self.gateway, *self._retired] if g is self.gateway or self._calls.get(id(g), 0)]
        for gateway in [g for g in self._retired if g not in live]:
            self._retired.remove(gateway)
            self._calls.pop(id(gateway), None)
            if all(gateway.writer is not g.writer for g in live):
                gateway.writer.close()
            if all(gateway.backend is not g.backend for g in live):
                try:
                    asyncio.get_running_loop().create_task(gateway.backend.aclose())
                except RuntimeError:
                    pass  # configured outside a loop (a test by hand): its client goes with it

    def in_flight(self) -> int:
        """Calls answering now, a stream until its row is committed."""
        return sum(self._calls.values())

    async def stop_calls(self, settle_s: float = 10.0) -> None:
        """End every call still in flight, each captured: streams with their provider's error event, calls
        waiting upstream with an error answer (their upstream client closes). Waits up to `settle_s` for
        their rows."""
        self.stopping = True
        err = GatewayError("stopping", "polar was stopped during this answer; the tokens sampled so far are "
                                       "captured; retry the call")
        for call in list(self._streams):
            call.stop(err)
        deadline = asyncio.get_running_loop().time() + settle_s
        while self._streams and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        gateways = [g for g in [self.gateway, *self._retired] if g is not None]
        for backend in {id(g.backend): g.backend for g in gateways}.values():
            await backend.aclose()
        while self.in_flight() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)

    async def done(self) -> None:
        asyncio.get_running_loop().set_exception_handler(quiet_cancelled)  # idle keep-alives, cancelled
        await self.stop_calls()  # ends what a drain left, closes every upstream client (mitm/shutdown.py)
        await self.relay.stop()  # its streams have ended: before their writers close
        gateways = [*self._retired, self.gateway]
        for writer in {id(g.writer): g.writer for g in gateways if g is not None}.values():
            writer.close()
