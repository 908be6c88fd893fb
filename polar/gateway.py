"""The gateway pipeline, independent of mitmproxy: one HTTP request in, one HTTP reply out.

    detect provider → resolve session → capture (pending) → parse → upstream → render
    → capture (final, committed) → reply

The mitmproxy addon, the CLI and the tests all drive this one class. Every path out of
`handle` — success, client error, upstream failure, polar bug — answers in the caller's
provider shape and leaves a committed capture row saying what happened.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from polar.canonical import ChatRequest, ChatResult, Message, TextPart
from polar.capture.store import CaptureStore
from polar.errors import GatewayError
from polar.providers import ProviderSet, Sealer
from polar.providers.base import HttpReply, Parsed, Provider, Route
from polar.sessions import Identity, SessionRegistry, redact

log = logging.getLogger("polar.gateway")

# Bodies above this are stored truncated (the call is still recorded, with its error).
STORED_BODY_LIMIT = 8 * 1024 * 1024


class Backend(Protocol):
    """What the gateway needs from an upstream (vLLM chat today; token-in backends next)."""

    async def model(self) -> str: ...

    async def complete(self, request: ChatRequest, call_id: str, session: str = "", row_id: int = 0) -> ChatResult: ...

    async def count_tokens(self, request: ChatRequest) -> int: ...


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
    reply: HttpReply
    # What mitmweb and logs show for the flow: session, provider, call id, token counts.
    meta: dict[str, Any] = field(default_factory=dict)


class Gateway:
    def __init__(
        self,
        store: CaptureStore,
        backend: Backend,
        registry: SessionRegistry | None = None,
        max_body_bytes: int = 64 * 1024 * 1024,
        model_aliases: list[str] | None = None,
    ):
        self.store = store
        self.backend = backend
        self.registry = registry or SessionRegistry(salt=store.key_salt())
        self.providers = ProviderSet(Sealer(store.seal_key()))
        self.max_body_bytes = max_body_bytes
        self.model_aliases = model_aliases or []
        # Weight updates: a trainer pauses sampling, waits for in-flight calls, swaps weights and
        # resumes with the new version, which calls record when the upstream reports none itself.
        self.policy_version: str | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- weight updates (call on the proxy's event loop; from another thread use
    #    loop.call_soon_threadsafe / asyncio.run_coroutine_threadsafe) -----------------------

    def pause(self) -> None:
        """New model calls wait (they are not refused: harnesses just see a slower answer)."""
        self._open.clear()

    def resume(self, policy_version: str | None = None) -> None:
        if policy_version is not None:
            self.policy_version = policy_version
        self._open.set()

    def _version(self, upstream: int | str | None) -> str | None:
        """vLLM's own weight version when it tracks one; its placeholder "default" yields to the trainer's."""
        if upstream is not None and str(upstream) != "default":
            return str(upstream)
        return self.policy_version or (None if upstream is None else str(upstream))

    @property
    def in_flight(self) -> int:
        """Model calls being sampled right now."""
        return self._in_flight

    async def drain(self) -> None:
        """Return once no model call is being sampled."""
        await self._idle.wait()

    async def handle(self, req: GatewayRequest) -> GatewayReply:
        ident = self.registry.resolve(req.path, req.headers, req.client_addr)
        path = ident.path
        side = await self._side_call(req, path)
        if side is not None:
            return GatewayReply(side, {"session": ident.session, "kind": "side-call"})
        route = self.providers.detect(req.method, path, req.query, req.headers)
        provider = route.provider if route else self.providers.guess(path, req.headers)
        if route is None and req.method in ("GET", "HEAD"):
            # A client's own side channel (settings, feature flags): no model call, so no capture.
            err = GatewayError("not_found", f"polar does not serve {req.method} {path}")
            return GatewayReply(provider.render_error(err), {"session": ident.session, "kind": "side-call"})
        return await self._model_call(req, ident, route, provider)

    # -- side calls: answered, not captured ---------------------------------------------------

    async def _side_call(self, req: GatewayRequest, path: str) -> HttpReply | None:
        if req.headers.get("upgrade", "").lower() == "websocket":
            # Codex tries Responses-over-WebSocket first and falls back to HTTP when refused.
            err = GatewayError("invalid_request", "polar serves the Responses API over HTTP only; WebSocket refused")
            err.status = 426
            return self.providers.guess(path, req.headers).render_error(err)
        if path in ("/", "") and req.method in ("HEAD", "GET"):
            return HttpReply(200, b"" if req.method == "HEAD" else b"polar gateway\n", {"content-type": "text/plain"})
        if req.method == "GET" and path.rstrip("/").endswith("/models"):
            names = list(dict.fromkeys([await self._model_or_none(), *self.model_aliases]))
            return self.providers.guess(path, req.headers).render_models([n for n in names if n])
        return None

    async def _model_or_none(self) -> str | None:
        try:
            return await self.backend.model()
        except GatewayError:
            return None

    # -- model calls: always captured -------------------------------------------------------

    async def _model_call(
        self, req: GatewayRequest, ident: Identity, route: Route | None, provider: Provider
    ) -> GatewayReply:
        row_id = self.store.allocate_id()
        call_id = secrets.token_hex(12)
        t_start = time.time()
        self.store.begin(
            {
                "id": row_id,
                "call_id": call_id,
                "session_id": ident.session,
                "provider": provider.name,
                "endpoint": route.endpoint if route else "unknown",
                "path": req.path + (("?" + "&".join(f"{k}={v}" for k, v in req.query.items())) if req.query else ""),
                "status": "pending",
                "client": req.client_addr,
                "key_hash": ident.key_hash,
                "request_headers": json.dumps(redact(req.headers)),
                "request_body": req.body[:STORED_BODY_LIMIT],
                "t_start": t_start,
            }
        )
        meta: dict[str, Any] = {"session": ident.session, "provider": provider.name, "call_id": call_id, "row": row_id}
        fields: dict[str, Any] = {}
        request: ChatRequest | None = None
        try:
            if ident.refused:
                raise GatewayError("permission", f"this client belongs to session {ident.session!r} and may not "
                                                 f"act as session {ident.refused!r}")
            if route is None:
                raise GatewayError("not_found", f"polar does not serve {req.method} {ident.path}")
            parsed = self._parse(req, route)
            request = parsed.request
            if parsed.rewrites:
                fields["rewrites"] = json.dumps(parsed.rewrites)
            if request.continues:
                request = await self._continue_from(request, ident.session)
            fields["model"] = request.model
            fields["stream"] = int(request.stream)
            if route.endpoint == "count_tokens":
                reply = route.provider.render_count(route, await self.backend.count_tokens(request))
            else:
                await self._open.wait()
                self._in_flight += 1
                self._idle.clear()
                try:
                    reply = await self._generate(parsed, request, route, ident, call_id, fields, meta)
                finally:
                    self._in_flight -= 1
                    if self._in_flight == 0:
                        self._idle.set()
            fields.update(status="ok", http_status=reply.status)
        except GatewayError as err:
            reply = self._error(provider, err, fields)
        except Exception as exc:  # a polar bug: still answer in the provider's shape, still capture
            log.exception("polar failed on call %s", call_id)
            reply = self._error(provider, GatewayError("internal", f"polar failed on this call: {type(exc).__name__}: {exc}"), fields)
        if request is not None:
            fields["canonical"] = request.model_dump(mode="json", exclude_none=True)
        fields.update(response_body=reply.body, t_end=time.time())
        try:
            await self.store.finish(row_id, fields)
        except Exception as exc:  # not durable → the client must not proceed as if it were
            log.exception("capture of call %s failed", call_id)
            reply = provider.render_error(GatewayError("internal", f"polar could not record this call: {exc}"))
        reply.headers.update({"x-polar-call-id": call_id, "x-polar-session": ident.session})
        return GatewayReply(reply, meta)

    def _parse(self, req: GatewayRequest, route: Route) -> Parsed:
        if len(req.body) > self.max_body_bytes:
            raise GatewayError(
                "too_large", f"request body is {len(req.body)} bytes; polar accepts at most {self.max_body_bytes}"
            )
        try:
            body = json.loads(req.body) if req.body else None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GatewayError("invalid_request", f"request body is not valid JSON: {exc}") from None
        if body is None:
            raise GatewayError("invalid_request", "request body is empty; a JSON object is required")
        return route.provider.parse(route, body)

    async def _generate(
        self, parsed: Parsed, request: ChatRequest, route: Route, ident: Identity, call_id: str, fields: dict, meta: dict
    ) -> HttpReply:
        t_up = time.time()
        result = await self.backend.complete(request, call_id, ident.session, meta["row"])
        fields["t_upstream"] = time.time() - t_up
        reply = route.provider.render(route, parsed.context, request, result)
        fields.update(
            upstream_model=result.model,
            result=result.model_dump_json(exclude={"prompt_token_ids", "completion_token_ids", "completion_logprobs"}),
            finish_reason=result.finish_reason,
            policy_version=self._version(result.policy_version),
            prompt_mode=result.prompt_mode,
            **self.store.tokens_fields(
                ident.session, meta["row"], result.prompt_token_ids, result.completion_token_ids, result.completion_logprobs
            ),
        )
        meta.update(prompt_tokens=len(result.prompt_token_ids), completion_tokens=len(result.completion_token_ids))
        return reply

    async def _continue_from(self, request: ChatRequest, session: str) -> ChatRequest:
        """Responses `previous_response_id`: prepend that call's conversation and answer (same session only)."""
        response_id = request.continues or ""
        prior = await asyncio.to_thread(self.store.find_call, response_id.removeprefix("resp_"), session)
        if prior is None or not prior.get("canonical") or not prior.get("result"):
            raise GatewayError("invalid_request", f"previous response '{response_id}' was not found", param="previous_response_id")
        earlier = ChatRequest.model_validate(prior["canonical"])
        answer = ChatResult.model_validate(prior["result"])
        assistant = Message(
            role="assistant",
            content=[TextPart(text=answer.content)] if answer.content else [],
            reasoning=[answer.reasoning] if answer.reasoning else [],
            tool_calls=answer.tool_calls,
        )
        history = [m for m in earlier.messages if m.role != "system"] + [assistant]
        system = [m for m in request.messages if m.role == "system"]
        rest = [m for m in request.messages if m.role != "system"]
        return request.model_copy(update={"messages": system + history + rest})

    @staticmethod
    def _error(provider: Provider, err: GatewayError, fields: dict) -> HttpReply:
        reply = provider.render_error(err)
        fields.update(status="error", http_status=reply.status, error_kind=err.kind, error=err.message)
        return reply

