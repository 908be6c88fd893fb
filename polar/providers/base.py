"""The small interface every provider wire format implements.

A provider knows four things: which requests are its own (`match`), how its request body
becomes a canonical `ChatRequest` (`parse`), and how a `ChatResult` or a `GatewayError`
goes back in its exact response shape, streamed or not (`render`, `render_error`).
Everything else (sessions, upstream, capture) is shared and lives outside `providers/`.

What render needs beyond the canonical request (echoed settings, which tools were custom, the
client's display choices) travels in the provider's own typed context, handed back from `parse`
in `Parsed` — never through the canonical request the upstream sees.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from polar.canonical import ChatRequest, ChatResult, ToolCall
from polar.errors import STATUS, GatewayError
from polar.json_values import compact
from polar.providers.history import History
from polar.providers.reasoning_seal import Sealer
from polar.providers.stream import StreamRenderer

Endpoint = Literal["generate", "count_tokens"]


@dataclass
class Route:
    """What a request is: which provider, which endpoint, and what the path itself says."""

    provider: Provider
    endpoint: Endpoint
    model: str | None = None  # from the path (Gemini puts the model there)
    stream: bool | None = None  # from the path (Gemini :streamGenerateContent)
    query: dict[str, str] = field(default_factory=dict)


@dataclass
class HttpReply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> HttpReply:
        return cls(status, compact(obj), {"content-type": "application/json", **(headers or {})})

    @classmethod
    def sse(cls, body: bytes, headers: dict[str, str] | None = None) -> HttpReply:
        base = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
        return cls(200, body, {**base, **(headers or {})})


@dataclass
class Parsed[Ctx]:
    """A parsed request: the canonical request, the provider's render context, and what the
    parser changed or left out (short human-readable notes the gateway records on the capture)."""

    request: ChatRequest
    context: Ctx
    rewrites: list[str] = field(default_factory=list)


class Provider[Ctx]:
    name: ClassVar[str]
    # kind -> HTTP status on this API; `GatewayError.status`, when the raiser set one, wins.
    statuses: ClassVar[dict[str, int]] = STATUS

    def __init__(self, sealer: Sealer):
        self.sealer = sealer  # mints and opens the reasoning tokens clients echo back (their capture DB's key)

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        """Return a Route when (method, path) is one of this provider's model endpoints."""
        raise NotImplementedError

    def parse(self, route: Route, body: Any, history: History | None = None) -> Parsed[Ctx]:
        """Provider JSON body (already decoded) → canonical request. Raises GatewayError('invalid_request').
        `history`: the session's earlier reads of this format's history items (providers/history.py)."""
        raise NotImplementedError

    def render(self, route: Route, context: Ctx, request: ChatRequest, result: ChatResult) -> HttpReply:
        """Canonical result → the provider's response, as an SSE stream when `request.stream`."""
        raise NotImplementedError

    def stream_renderer(self, route: Route, context: Ctx, request: ChatRequest, call_id: str) -> StreamRenderer:
        """A live stream of the answer to `request` (ids derived from `call_id`, as `render` derives them)."""
        raise NotImplementedError

    def stream_headers(self) -> dict[str, str]:
        """Headers of a live stream's answer besides its content type."""
        return {}

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        """The answer to a count-tokens call."""
        raise NotImplementedError

    def render_error(self, error: GatewayError) -> HttpReply:
        """The provider's own error object, with the status decided here, once for all providers."""
        status = error.status or self.statuses[error.kind]
        body, headers = self.error_body(error, status)
        return HttpReply.json(body, status=status, headers=headers)

    def error_body(self, error: GatewayError, status: int) -> tuple[dict[str, Any], dict[str, str]]:
        """The provider's error object (and any headers) for an error answered with `status`."""
        raise NotImplementedError

    def model_card(self, name: str, window: int | None) -> dict[str, Any]:
        """One served model as this API describes it (`window`: the upstream's context length, when known)."""
        raise NotImplementedError

    def render_models(self, models: list[str], window: int | None = None) -> HttpReply:
        """The provider's model listing (GET …/models)."""
        raise NotImplementedError

    def render_model(self, name: str, window: int | None = None) -> HttpReply:
        """One model's card (GET …/models/{id}): polar serves every name it is asked for with its one model."""
        return HttpReply.json(self.model_card(name, window))


def bare_path(path: str) -> str:
    """The path without a query string (Azure adds `?api-version=`) or trailing slash."""
    return path.split("?", 1)[0].rstrip("/")


def new_id(prefix: str, nbytes: int = 12) -> str:
    return f"{prefix}{secrets.token_hex(nbytes)}"


def now() -> int:
    return int(time.time())


def arguments_object(call: ToolCall) -> dict[str, Any]:
    """Arguments for APIs that type them as an object (Anthropic `input`, Gemini `args`);
    anything that is not a JSON object is handed over raw, as {"_raw": text}."""
    value = call.arguments_obj()
    return value if isinstance(value, dict) else {"_raw": call.arguments}


def object_of(arguments: str) -> dict[str, Any]:
    """`arguments_object` for arguments given as text (a streamed call)."""
    return arguments_object(ToolCall(id="", name="", arguments=arguments))
