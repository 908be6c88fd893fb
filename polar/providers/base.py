"""The small interface every provider wire format implements.

A provider knows four things: which requests are its own (`match`), how its request body
becomes a canonical `ChatRequest` (`parse`), and how a `ChatResult` or a `GatewayError`
goes back in its exact response shape, streamed or not (`render`, `render_error`).
Everything else (sessions, upstream, capture) is shared and lives outside `providers/`.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from polar.canonical import ChatRequest, ChatResult
from polar.errors import GatewayError

Endpoint = Literal["generate", "count_tokens"]


@dataclass
class Route:
    """What a request is: which provider, which endpoint, and what the path itself says."""

    provider: "Provider"
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
    def json(cls, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> "HttpReply":
        return cls(status, dumps(obj), {"content-type": "application/json", **(headers or {})})

    @classmethod
    def sse(cls, body: bytes, headers: dict[str, str] | None = None) -> "HttpReply":
        base = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
        return cls(200, body, {**base, **(headers or {})})


class Provider:
    name: ClassVar[str]

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        """Return a Route when (method, path) is one of this provider's model endpoints."""
        raise NotImplementedError

    def parse(self, route: Route, body: Any) -> ChatRequest:
        """Provider JSON body (already decoded) → canonical request. Raises GatewayError('invalid_request')."""
        raise NotImplementedError

    def render(self, route: Route, request: ChatRequest, result: ChatResult) -> HttpReply:
        """Canonical result → the provider's response, as an SSE stream when `request.stream`."""
        raise NotImplementedError

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        """The answer to a count-tokens call."""
        raise NotImplementedError

    def render_error(self, error: GatewayError) -> HttpReply:
        """The provider's own error object and status code."""
        raise NotImplementedError

    def render_models(self, models: list[str]) -> HttpReply:
        """The provider's model listing (GET …/models)."""
        raise NotImplementedError


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One SSE event. `data` that is not already a string is JSON-encoded on one line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def new_id(prefix: str, nbytes: int = 12) -> str:
    return f"{prefix}{secrets.token_hex(nbytes)}"


def now() -> int:
    return int(time.time())
