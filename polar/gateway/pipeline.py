"""The gateway pipeline, independent of mitmproxy: one HTTP request in, one HTTP reply out.

    resolve session → detect provider → parse → shape → session state → upstream, and as it works the
    capture arrival (pending) → render → capture completion (durable) → remember the turn → reply

The mitmproxy addon, the CLI and the tests all drive this one class. Every path out of
`handle` — success, client error, upstream failure, polar bug — answers in the caller's
provider shape and leaves a committed capture row saying what happened; when the capture itself
cannot be written, the client gets a 5xx in its provider's shape instead of an unrecorded answer.
The session state learns a call's tokens only after its row has committed.

A call that asks for a stream gets a `StreamReply` as soon as its upstream request is sent: whoever
writes it to the client first awaits `begin` (the upstream's refusal within the keep-alive interval is
still a plain error answer), then streams the body as the model samples (gateway/streaming.py); the
same settling commits its row before the stream's terminal event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from polar.canonical import ChatRequest, ChatResult
from polar.capture.reader import CaptureReader
from polar.capture.records import CallEnd, CallStart, MessageLog, MessageRefs, TokenRecord, encode_messages
from polar.capture.tokens import as_ids
from polar.capture.working_set import Budgets
from polar.capture.writer import Arrival, CaptureError, CaptureWriter
from polar.errors import GatewayError
from polar.gateway.body import decode
from polar.gateway.gate import SamplingGate
from polar.gateway.methods import allowed, headers_only, method_reply
from polar.gateway.probes import Served, answer_probe, answer_show, probe_path, show_path
from polar.gateway.streaming import StreamingCall, StreamReply
from polar.providers import ProviderSet, Sealer
from polar.providers.base import HttpReply, Parsed, Provider, Route
from polar.providers.history import Histories
from polar.sessions.fingerprints import answer_message, message_fingerprint
from polar.sessions.identity import SESSION_HEADER, Identity, SessionRegistry, redact
from polar.sessions.state import NO_BRANCH, Branch, SessionState, SessionStates, SessionView, Turn, new_turn
from polar.tokens.shaping import ANY_TEMPLATE, shape
from polar.upstream.base import Backend, UpstreamStream

CALL_ID_HEADER = "x-polar-call-id"  # beside identity.SESSION_HEADER on every answer
log = logging.getLogger("polar.gateway")


@dataclass
class GatewayRequest:
    method: str
    path: str  # without the query string
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes
    client_addr: str | None = None


@dataclass
class GatewayReply:
    reply: HttpReply | StreamReply
    # What mitmweb and logs show for the flow: session, provider, call id, row, token counts.
    meta: dict[str, Any] = field(default_factory=dict)


class Gateway:
    def __init__(
        self,
        writer: CaptureWriter,
        backend: Backend,
        registry: SessionRegistry | None = None,
        states: SessionStates | None = None,
        gate: SamplingGate | None = None,
        max_body_bytes: int = 64 * 1024 * 1024,
        model_aliases: list[str] | None = None,
        keepalive_s: float = 5.0,
        histories: Histories | None = None,
    ):
        self.writer = writer
        self.reader = CaptureReader(writer.path)
        self.backend = backend
        self.registry = registry or SessionRegistry(salt=writer.key_salt)
        self.states = states if states is not None else SessionStates(self.reader.recent_calls)  # (empty is falsy)
        self.gate = gate or SamplingGate()
        # A fleet checks, before sampling resumes under a new policy version, that every replica serves it.
        self.gate.before_resume = getattr(backend, "adopt_version", None)
        self.providers = ProviderSet(Sealer(writer.seal_key))  # reasoning seals keyed per capture database
        # Each session's last reads of its history: a call parses only what its history adds.
        self.histories = histories if histories is not None else Histories()
        self.max_body_bytes = max_body_bytes
        self.model_aliases = model_aliases or []
        self.keepalive_s = keepalive_s  # silence on a stream after which the client gets a keep-alive
        self.dropped_messages = "splice"  # polar_dropped_messages, unless a runtime set the session's own

    def size_caches(self, budgets: Budgets) -> None:
        """Size the per-session caches (capture/working_set.py) for as many sessions taking turns at once."""
        self.histories.max_bytes = budgets.history_bytes
        self.states.max_tokens, self.states.max_sessions = budgets.state_tokens, budgets.state_sessions
        self.writer.size_bases(budgets.base_bytes)

    async def handle(self, req: GatewayRequest) -> GatewayReply:
        if req.method == "HEAD":  # GET's answer without its body, for every path
            out = await self.handle(dataclasses.replace(req, method="GET", body=b""))
            return GatewayReply(headers_only(out.reply), out.meta)
        ident = self.registry.resolve(req.path, req.headers, req.client_addr)
        path = ident.path
        # Detected once: the model endpoint a POST to this path reaches (what the path allows follows from it).
        route = self.providers.detect("POST", path, req.query, req.headers)
        side = await self._side_call(req, path, route)
        if side is not None:
            return GatewayReply(side, {"session": ident.session, "kind": "side-call"})
        provider = route.provider if route else self.providers.guess(path, req.headers)
        if route is None and req.method != "POST":
            # Not a model call (a client's settings or feature-flag channel, a probe): no capture.
            err = GatewayError("not_found", f"polar does not serve {req.method} {path}")
            return GatewayReply(provider.render_error(err), {"session": ident.session, "kind": "side-call"})
        return await self._model_call(req, ident, route, provider)

    # -- side calls: answered, not captured ---------------------------------------------------

    async def _side_call(self, req: GatewayRequest, path: str, route: Route | None) -> HttpReply | None:
        if req.headers.get("upgrade", "").lower() == "websocket":
            # Codex tries Responses-over-WebSocket first and falls back to HTTP when refused.
            err = GatewayError("invalid_request", "polar serves the Responses API over HTTP only; WebSocket refused")
            err.status = 426
            return self.providers.guess(path, req.headers).render_error(err)
        allow = allowed(route, path)  # a route is taken by POST alone: any other method is answered here
        if allow and (refused := method_reply(self.providers, req.method, path, allow, req.headers)):
            return refused  # OPTIONS, or a method the path does not take: not a model call
        if path in ("/", "") and req.method == "GET":
            return HttpReply(200, b"polar gateway\n", {"content-type": "text/plain"})
        if req.method == "GET" and probe_path(path):
            return answer_probe(self.providers.guess(path, req.headers), path, await self._served())
        if req.method == "POST" and show_path(path):
            return answer_show(req.body, req.headers.get("content-type"), self.max_body_bytes, await self._served())
        return None

    async def _served(self) -> Served:
        """The served model as probes are told of it; an upstream that cannot say leaves it out."""
        names = list(dict.fromkeys([await _or_none(self.backend.model()), *self.model_aliases]))
        traits = self.backend.template_traits()
        return Served([n for n in names if n], await _or_none(self.backend.context_length()),
                      vision=bool(traits and traits.images))

    # -- model calls: always captured -------------------------------------------------------

    async def _model_call(
        self, req: GatewayRequest, ident: Identity, route: Route | None, provider: Provider
    ) -> GatewayReply:
        call = CallStart(
            call_id=secrets.token_hex(12),
            session_id=ident.session,
            provider=provider.name,
            endpoint=route.endpoint if route else "unknown",
            path=req.path + (("?" + "&".join(f"{k}={v}" for k, v in req.query.items())) if req.query else ""),
            client=req.client_addr,
            key_hash=ident.key_hash,
            request_headers=redact(req.headers),
            request_body=req.body,
            t_start=time.time(),
        )
        meta: dict[str, Any] = {"session": ident.session, "provider": provider.name, "call_id": call.call_id}
        call_state = _Call(arrival=Arrival(call))
        settle = functools.partial(self._settle, call_state, ident.session, meta)
        try:
            answer = await self._answer(req, ident, route, call, call_state)
            if isinstance(answer, _Opened):
                return GatewayReply(self._stream_reply(answer, provider, call, ident, settle), meta)
            reply, end = answer, CallEnd(status="ok", http_status=answer.status, response_body=answer.body, t_end=0.0)
        except GatewayError as err:
            reply, end = self._error(provider, err)
        except Exception as exc:  # a polar bug: still answer in the provider's shape, still capture
            log.exception("polar failed on call %s", call.call_id)
            reply, end = self._error(provider, GatewayError("internal", f"polar failed on this call: {type(exc).__name__}: {exc}"))
        if failure := await settle(end, call_state.result):  # not durable → the client must not proceed as if it were
            reply = provider.render_error(GatewayError("internal", f"polar could not record this call: {failure}"))
        reply.headers.update(_ids(call, ident))
        return GatewayReply(reply, meta)

    def _stream_reply(self, opened: _Opened, provider: Provider, call: CallStart, ident: Identity, settle) -> StreamReply:
        ids = _ids(call, ident)
        stream = StreamingCall(opened.upstream, opened.renderer, settle, opened.slot, self.keepalive_s,
                               provider_status=lambda err: err.status or provider.statuses[err.kind],
                               refuse=lambda err: self._error(provider, err), headers=ids)
        headers = {**provider.stream_headers(), "content-type": opened.renderer.content_type, "cache-control": "no-cache",
                   **ids}
        return StreamReply(200, headers, stream)

    async def _settle(self, state: _Call, session: str,
                      meta: dict[str, Any], end: CallEnd, result: ChatResult | None) -> str | None:
        """Fill the call's row from what it learnt, commit it, then let the session state learn the turn.
        Returns why the row could not be committed, or None."""
        arrival = state.arrival
        call = arrival.call
        if result is not None and state.result is None:  # a streamed turn: known only now
            state.take(result, time.time() - state.t_up_start)
        state.fill(end, self.gate)
        end.t_end = time.time()
        committed = self.writer.finish(arrival, end)
        turn = self._turn(state, end)  # built while the WAL is synced (the loop waits on the fdatasync otherwise)
        try:
            meta["row"] = await committed
        except CaptureError as exc:
            log.error("call %s could not be recorded: %s", call.call_id, exc)
            return str(exc)
        self._remember(session, meta["row"], turn, state)
        if state.result is not None:
            meta.update(prompt_tokens=len(state.result.prompt_token_ids),
                        completion_tokens=len(state.result.completion_token_ids))
        return None

    async def _answer(
        self, req: GatewayRequest, ident: Identity, route: Route | None, call: CallStart, state: _Call
    ) -> HttpReply | _Opened:
        if ident.refused:
            raise GatewayError("permission", f"this client belongs to session {ident.session!r} and may not "
                                             f"act as session {ident.refused!r}")
        if route is None:
            raise GatewayError("not_found", f"polar does not serve {req.method} {ident.path}")
        parsed = self._parse(req, route, ident.session)
        state.rewrites = list(parsed.rewrites)
        request = parsed.request
        if request.continues:
            request = await self._continue_from(request, ident.session)
        # As the served model's template accepts it (merged leading systems, late systems carried as
        # the family takes them, images refused on text models), the same way on every turn.
        request, notes = shape(request, self.backend.template_traits() or ANY_TEMPLATE)
        state.rewrites += notes
        state.request = request
        if route.endpoint == "count_tokens":
            return route.provider.render_count(route, await self.backend.count_tokens(request))
        session = await self.states.get(ident.session)  # rebuilt from the database off the loop when needed
        state.session, state.session_messages = session, session.messages
        state.keys = [message_fingerprint(m) for m in request.messages]
        keep = (self.registry.dropped_messages(ident.session) or self.dropped_messages) == "keep"
        view = SessionView(session, state.keys, ident.session, keep_dropped=keep)
        if request.stream:
            return await self._open_stream(route, parsed.context, request, call, state, view)
        async with self.gate.sampling():
            t_up = time.time()
            # Sent before the arrival is written, which then overlaps the upstream's work (mitmproxy's loop starts
            # tasks eagerly: the request is on the wire when create_task returns).
            upstream = asyncio.ensure_future(self.backend.complete(request, call.call_id, view))
            try:
                state.arrive(self.writer)
                result = await upstream
            except BaseException:  # nobody is left to read the answer: the upstream stops working on it
                upstream.cancel()
                raise
        state.take(result, time.time() - t_up)
        return route.provider.render(route, parsed.context, request, result)

    async def _open_stream(self, route: Route, context: Any, request: ChatRequest, call: CallStart, state: _Call,
                           view: SessionView) -> _Opened:
        """Send the upstream request, holding a sampling slot until the stream ends (the stream releases it).
        Whether the upstream takes it is the stream's `begin` to wait for, while the client's side connects."""
        slot = AsyncExitStack()
        await slot.enter_async_context(self.gate.sampling())
        state.t_up_start = time.time()
        try:
            upstream = await self.backend.stream(request, call.call_id, view)
        except BaseException:
            await slot.aclose()
            raise
        state.arrive(self.writer)  # written while the upstream queues and prefills
        return _Opened(upstream, route.provider.stream_renderer(route, context, request, call.call_id), slot)

    @staticmethod
    def _turn(state: _Call, end: CallEnd) -> Turn | None:
        """The turn the session state learns once the call's row has committed (its row id set then)."""
        if state.result is None or state.request is None or end.status != "ok":
            return None
        return new_turn(0, state.request, state.keys, state.result, state.prompt, state.branch)

    def _remember(self, session: str, row_id: int, turn: Turn | None, state: _Call) -> None:
        messages = None
        if state.canonical is not None and state.refs is not None:
            messages = state.refs.log(row_id, state.canonical["messages"])
        if turn is not None:
            turn.row = row_id
        self.states.record(session, turn, messages)

    def _parse(self, req: GatewayRequest, route: Route, session: str) -> Parsed:
        body, exact = decode(req.body, req.headers.get("content-type"), self.max_body_bytes)
        # The session's history compares items by their JSON text: only a body orjson decoded has one each.
        history = self.histories.get(session, route.provider.name, len(req.body)) if exact else None
        return route.provider.parse(route, body, history)

    async def _continue_from(self, request: ChatRequest, session: str) -> ChatRequest:
        """Responses `previous_response_id`: prepend that call's conversation and answer (same session only)."""
        response_id = request.continues or ""
        prior = await asyncio.to_thread(self.reader.find_call, response_id.removeprefix("resp_"), session)
        if prior is None or not prior.get("canonical") or not prior.get("result"):
            raise GatewayError("invalid_request", f"previous response '{response_id}' was not found", param="previous_response_id")
        earlier = ChatRequest.model_validate(prior["canonical"])
        assistant = answer_message(ChatResult.model_validate(prior["result"]))
        history = [m for m in earlier.messages if m.role != "system"] + [assistant]
        system = [m for m in request.messages if m.role == "system"]
        rest = [m for m in request.messages if m.role != "system"]
        return request.model_copy(update={"messages": system + history + rest})

    @staticmethod
    def _error(provider: Provider, err: GatewayError) -> tuple[HttpReply, CallEnd]:
        reply = provider.render_error(err)
        end = CallEnd(status="error", http_status=reply.status, response_body=reply.body, t_end=0.0,
                      error_kind=err.kind, error=err.message, replica=err.replica)
        return reply, end


async def _or_none[T](answer: Awaitable[T]) -> T | None:
    try:
        return await answer
    except GatewayError:
        return None


@dataclass
class _Opened:
    """A stream sent upstream: its renderer, and the sampling slot it holds until it ends."""

    upstream: UpstreamStream
    renderer: Any
    slot: AsyncExitStack


@dataclass
class _Call:
    """What one model call learnt on its way, for its capture row and its session's state."""

    # The call's row: its pending arrival is written once the call has gone upstream (a crash from then on
    # leaves it visible, pending); one refused before that gets its row whole at the end.
    arrival: Arrival
    request: ChatRequest | None = None
    result: ChatResult | None = None
    keys: list[str] = field(default_factory=list)
    session: SessionState | None = None
    session_messages: MessageLog = field(default_factory=MessageLog)
    branch: Branch = NO_BRANCH  # the earlier turn the prompt repeats the start of, and how much
    prompt: Any = None  # the prompt ids as a uint32 array
    t_up_start: float = 0.0
    t_upstream: float | None = None
    rewrites: list[str] = field(default_factory=list)  # what polar changed in the request, and why
    canonical: dict[str, Any] | None = None  # the request as stored (described() makes it once)
    refs: MessageRefs | None = None  # its messages as references

    def arrive(self, writer: CaptureWriter) -> None:
        """Write the call's pending row, with the request as it went upstream."""
        call = self.arrival.call
        call.canonical, call.messages = self.described()
        self.arrival = writer.start(call)

    def described(self) -> tuple[dict[str, Any] | None, MessageRefs | None]:
        """The request as stored and its messages as references to the session's last call's (once)."""
        if self.canonical is None and self.request is not None:
            self.canonical = self.request.stored()
            self.refs = encode_messages(self.canonical["messages"], self.session_messages)
        return self.canonical, self.refs

    def take(self, result: ChatResult, t_upstream: float) -> None:
        """The sampled turn (whole, or as far as a stream got)."""
        self.result, self.t_upstream = result, t_upstream
        self.prompt = as_ids(result.prompt_token_ids)  # converted once: lineage, token columns, turn
        self.branch = self.session.branch_point(self.prompt) if self.session is not None else NO_BRANCH

    def fill(self, end: CallEnd, gate: SamplingGate) -> None:
        end.rewrites = [*self.rewrites, *end.rewrites]
        if self.request is not None:
            end.model, end.stream = self.request.model, self.request.stream
            if self.arrival.call.canonical is None:  # not written with an arrival: the completion writes it
                end.canonical, end.messages = self.described()
        result = self.result
        if result is None:
            return
        end.t_upstream = self.t_upstream
        end.upstream_model = result.model
        end.result = result.model_dump_json(exclude={"prompt_token_ids", "completion_token_ids", "completion_logprobs"})
        end.finish_reason = end.finish_reason or result.finish_reason  # a broken stream says "abort"
        end.policy_version, end.weight_version = gate.policy_version, result.weight_version
        end.prompt_mode = result.prompt_mode
        end.replica = result.replica or end.replica
        end.tokens = TokenRecord(self.prompt, result.completion_token_ids, result.completion_logprobs,
                                 self.branch.lineage)


def _ids(call: CallStart, ident: Identity) -> dict[str, str]:
    """The headers naming the call and its session on every answer (the session's by the header clients send)."""
    return {CALL_ID_HEADER: call.call_id, SESSION_HEADER: ident.session}
