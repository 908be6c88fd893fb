"""The mitmproxy addon: hands each HTTP flow to the gateway and answers it from the proxy.

Configured entirely through mitmproxy options (`--set polar_upstream=…`), so `mitmdump -s
addons/polar_gateway.py`, `mitmweb -s …` and `polar proxy` run the very same code. Flows carry
the session, provider and token counts (`flow.metadata["polar"]`, the flow comment) so mitmweb
shows them; its "polar" contentview (mitm/contentview.py) shows a call's capture in full.

Streamed answers leave through the loopback relay (mitm/relay.py): mitmproxy streams a body only
when it comes from a server, so the flow is pointed at the relay, which writes the gateway's stream
as the model samples it. The flow still shows in mitmweb, with the client's own request.

An option change rebuilds only the part it touches, as mitmproxy's own addons do: the capture
writer (`polar_db*`), the upstream backend (`polar_upstream*`, tokenizer, template), or nothing
(body limit, aliases). Calls in flight finish on the parts they started with, which are closed
once their last call is done. Registered sessions, the sampling gate and session state survive
(state is dropped only when the database or the prompt format changes).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from mitmproxy import contentviews, ctx, exceptions, http
from mitmproxy.net.http import status_codes

from polar.capture import working_set
from polar.capture.writer import CaptureWriter
from polar.errors import GatewayError
from polar.gateway.gate import SamplingGate
from polar.gateway.pipeline import Gateway, GatewayReply, GatewayRequest
from polar.gateway.streaming import StreamingCall, StreamReply
from polar.mitm import backlog, shutdown
from polar.mitm.contentview import PolarContentview
from polar.mitm.relay import StreamRelay
from polar.providers.base import HttpReply
from polar.sessions.identity import IDENTITY_HEADERS, REDACTED, SECRET_HEADERS, SessionRegistry
from polar.upstream.fleet.build import upstream_backend
from polar.upstream.fleet.replicas import upstream_urls

log = logging.getLogger("polar.addon")


def gateway_headers(headers: http.Headers) -> dict[str, str]:
    """The request's headers by lower-case name, in one pass over the lines (mitmproxy's `items()` scans
    every line once per name). A repeated header is joined (HTTP's list rule), except the ones that name a
    session: of those the last line counts, as in the `--workers` front (haproxy's fhdr)."""
    joined: dict[str, str] = {}
    for raw_name, raw_value in headers.fields:
        name = raw_name.decode("utf-8", "surrogateescape").lower()  # as mitmproxy decodes them
        value = raw_value.decode("utf-8", "surrogateescape")
        if name in joined and name not in IDENTITY_HEADERS:
            value = f"{joined[name]}, {value}"
        joined[name] = value
    return joined

def flow_response(reply: HttpReply) -> http.Response:
    """The gateway's reply as mitmproxy's response, its headers encoded once (`Response.make` encodes them, then
    looks the length up among them again). Its length is the body's, unless the reply names one — a HEAD answer
    announces GET's — or it is a 204, which has none (RFC 9110)."""
    fields = [(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")) for k, v in reply.headers.items()]
    if "content-length" not in reply.headers and reply.status != 204:
        fields.append((b"content-length", b"%d" % len(reply.body)))
    now = time.time()
    return http.Response(b"HTTP/1.1", reply.status, status_codes.RESPONSES.get(reply.status, "").encode(),
                         http.Headers(fields), reply.body, None, now, now)


WRITER_OPTIONS = {"polar_db", "polar_db_sync", "polar_db_busy_timeout"}
BACKEND_OPTIONS = {
    "polar_upstream", "polar_upstream_model", "polar_upstream_key", "polar_upstream_timeout",
    "polar_tokenizer", "polar_chat_template", "polar_token_endpoint", "polar_fleet_imbalance",
}  # fmt: skip
PROMPT_OPTIONS = {"polar_tokenizer", "polar_chat_template"}  # change the ids a session's turns hold
GATEWAY_OPTIONS = {"polar_max_body", "polar_model_aliases", "polar_stream_keepalive", "polar_hot_sessions"}


def build_backend(opts):
    try:
        urls = upstream_urls([opts.polar_upstream])
    except ValueError as exc:
        raise exceptions.OptionsError(f"polar_upstream: {exc}") from None
    if not urls:
        raise exceptions.OptionsError("polar_upstream names no upstream")
    return upstream_backend(
        urls, model=opts.polar_upstream_model or None, api_key=opts.polar_upstream_key or None,
        timeout=opts.polar_upstream_timeout, chat_template=opts.polar_chat_template or None,
        tokenizer=opts.polar_tokenizer or None, endpoint=opts.polar_token_endpoint,
        imbalance=opts.polar_fleet_imbalance / 100,
    )


class PolarAddon:
    def __init__(self) -> None:
        self.gateway: Gateway | None = None
        self.gate = SamplingGate()  # a paused trainer stays paused across option changes
        self._calls: dict[int, int] = {}  # id(gateway) → calls in flight on it (a stream until it settles)
        self._retired: list[Gateway] = []
        self.relay = StreamRelay()
        self.stopping = False  # polar is shutting down (mitm/shutdown.py): new calls are refused
        self._streams: set[StreamingCall] = set()  # streamed answers in flight, to end them when polar stops
        self._addr_header = ""  # polar_client_addr_header

    @property
    def registry(self) -> SessionRegistry | None:
        return self.gateway.registry if self.gateway else None

    def load(self, loader) -> None:
        contentviews.add(PolarContentview(lambda: self.gateway))  # the "polar" view of each call in mitmweb
        loader.add_option("polar_upstream", str, "http://127.0.0.1:8000",
                          "Base URL of the vLLM server; several, comma-separated: a fleet of replicas of one model "
                          "(session-affine routing, failover: polar/upstream/fleet).")
        loader.add_option("polar_fleet_imbalance", int, 150,
                          "Fleet routing: a session stays on (and a new one joins) the replica caching its prefix "
                          "unless that replica's in-flight tokens exceed this percent of the fleet's mean.")
        loader.add_option("polar_upstream_model", str, "", "Served model name at the upstream ('' = ask its /v1/models).")
        loader.add_option("polar_upstream_key", str, "", "API key polar sends to the upstream (never the client's).")
        # int, not float: mitmproxy's `--set` cannot parse float options.
        loader.add_option("polar_upstream_timeout", int, 600, "Seconds to wait for one upstream answer.")
        loader.add_option("polar_db", str, "captures.db", "SQLite file that receives one row per model call.")
        loader.add_option(
            "polar_db_sync", str, "FULL", "SQLite synchronous mode for captures.", choices=["FULL", "NORMAL"]
        )
        loader.add_option(
            "polar_db_busy_timeout", int, 30,
            "Seconds a capture write waits for another process's lock on the database before the call fails.",
        )
        loader.add_option("polar_max_body", int, 64 * 1024 * 1024, "Largest request body accepted, in bytes.")
        loader.add_option("polar_model_aliases", Sequence[str], [], "Extra model names listed on GET …/models.")
        loader.add_option(
            "polar_tokenizer", str, "",
            "Hugging Face tokenizer dir of the served model. Set = token-faithful prompts (polar builds the prompt ids, "
            "reusing each session's sampled ids); '' = vLLM renders the chat template.",
        )
        loader.add_option("polar_chat_template", str, "", "Jinja chat template file of the served model ('' = the tokenizer's own). Token-faithful prompts render "
            "with it; in both modes polar shapes messages so that this template accepts them.")
        loader.add_option(
            "polar_token_endpoint", str, "auto", "Token-in vLLM endpoint.", choices=["auto", "generate", "completions"]
        )
        loader.add_option(
            "polar_client_addr_header", str, "",
            "Header naming the client's address, set by polar's own front (`polar proxy --workers`); '' = the "
            "connection's peer. Only for a proxy no client reaches directly: a client could claim any address.",
        )
        loader.add_option(
            "polar_drain", int, shutdown.DRAIN_S,
            "Seconds calls in flight may go on once polar is told to stop (SIGTERM, SIGINT); then a stream ends with "
            "its provider's error event and a call waiting upstream with an error answer, each captured.",
        )
        loader.add_option(
            "polar_hot_sessions", int, working_set.HOT_SESSIONS,
            "Sessions taking turns at once that polar keeps each one's history reads, body bases and token ids for "
            "(~8 MB of memory per 128k-token session). Fewer fit: their calls redo that work (a warning says so).",
        )
        loader.add_option(
            "polar_stream_keepalive", int, 5,
            "Seconds a streamed answer may stay silent (queue, prefill) before the client gets a keep-alive; 0 = never.",
        )

    def running(self) -> None:
        # Keep streamed answers on their flows, so mitmweb shows them like any other answer.
        if "store_streamed_bodies" in ctx.options and not ctx.options.store_streamed_bodies:
            ctx.options.update(store_streamed_bodies=True)
        if (proxyserver := ctx.master.addons.get("proxyserver")) is not None:
            backlog.widen(proxyserver)  # the servers mitmproxy has just opened (a mode changed later: asyncio's 100)
        # SIGTERM / SIGINT drain, then stop — under `polar proxy` and `mitmdump -s`/`mitmweb -s` alike (the
        # handlers replace the ones mitmproxy's main installed, which shut down at once, cutting calls in flight).
        shutdown.install(ctx.master, self)
        # What start-up built (mitmproxy, transformers, the template, ~200k objects) lives as long as the
        # process: out of the collector's sight, a full collection no longer walks it. The objects an
        # agent-sized request decodes to trigger full collections often, each walking all of start-up's.
        gc.freeze()

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        _check(opts, updated)
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
        self._comment(flow)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if self.relay.relayed(flow) is not None:
            self.relay.restore(flow)  # the request the client sent, for mitmweb
            flow.response.headers.pop("server", None)  # the relay's own; the client sees the gateway's headers
            flow.response.stream = True

    def response(self, flow: http.HTTPFlow) -> None:
        if self.relay.relayed(flow) is not None:
            self._comment(flow)  # the stream has ended: its token counts are known

    def error(self, flow: http.HTTPFlow) -> None:
        self.relay.client_gone(flow)  # a stream whose client went away: abort upstream, keep what was sampled

    @staticmethod
    def _comment(flow: http.HTTPFlow) -> None:
        meta = flow.metadata.get("polar") or {}
        if "call_id" in meta:
            flow.comment = " ".join(
                f"{k}={meta[k]}" for k in ("session", "provider", "prompt_tokens", "completion_tokens") if k in meta
            )

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
        asyncio.get_running_loop().set_exception_handler(shutdown.quiet_cancelled)  # idle keep-alives, cancelled
        await self.stop_calls()  # ends what a drain left, closes every upstream client (mitm/shutdown.py)
        await self.relay.stop()
        gateways = [*self._retired, self.gateway]
        for writer in {id(g.writer): g.writer for g in gateways if g is not None}.values():
            writer.close()


def _check(opts, updated: set[str]) -> None:
    """What mitmproxy lets through: `--set` does not hold a value to its option's choices (a typo in the commit
    mode would capture with another one, silently), and no option has a lower bound."""
    for name in sorted(n for n in updated if n.startswith("polar_")):
        choices = opts._options[name].choices
        if choices and getattr(opts, name) not in choices:
            raise exceptions.OptionsError(f"{name} must be one of {', '.join(choices)}, not {getattr(opts, name)!r}")
    if "polar_fleet_imbalance" in updated and opts.polar_fleet_imbalance < 100:
        raise exceptions.OptionsError(f"polar_fleet_imbalance is a percent of the mean load, at least 100, "
                                      f"not {opts.polar_fleet_imbalance}")
    if "polar_hot_sessions" in updated and opts.polar_hot_sessions < 1:
        raise exceptions.OptionsError(f"polar_hot_sessions must be at least 1, not {opts.polar_hot_sessions}")
