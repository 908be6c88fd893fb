"""Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens.

Requests become one `ChatRequest` (`parse.py`); results go back as a `Message` object or as the
exact SSE event sequence the official SDK's accumulator and Claude Code consume (`render.py`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from polar.canonical import ChatRequest, ChatResult
from polar.errors import GatewayError
from polar.providers.anthropic.parse import AnthropicContext, parse_request
from polar.providers.anthropic.render import ERRORS, error_object, message
from polar.providers.anthropic.stream import AnthropicStream
from polar.providers.base import (
    HttpReply,
    Parsed,
    Provider,
    Route,
    bare_path,
    new_id,
    now,
)
from polar.providers.history import History
from polar.providers.stream import replay

_GENERATE_PATH = "/v1/messages"
_COUNT_PATH = "/v1/messages/count_tokens"

class AnthropicMessages(Provider[AnthropicContext]):
    name = "anthropic"
    statuses: ClassVar[dict[str, int]] = {kind: status for kind, (_, status) in ERRORS.items()}

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        if method.upper() != "POST":
            return None
        path = bare_path(path)
        if path.endswith(_COUNT_PATH):
            return Route(self, "count_tokens", query=dict(query))
        if path.endswith(_GENERATE_PATH):
            return Route(self, "generate", query=dict(query))
        return None

    def parse(self, route: Route, body: Any, history: History | None = None) -> Parsed[AnthropicContext]:
        return parse_request(route, body, self.sealer, history)

    def render(self, route: Route, context: AnthropicContext, request: ChatRequest, result: ChatResult) -> HttpReply:
        headers = {"request-id": new_id("req_")}
        if not request.stream:
            return HttpReply.json(message(context, request, result, self.sealer), headers=headers)
        return HttpReply.sse(replay(self.stream_renderer(route, context, request, result.id), result), headers=headers)

    def stream_renderer(self, route: Route, context: AnthropicContext, request: ChatRequest, call_id: str) -> AnthropicStream:
        return AnthropicStream(context, request, call_id, self.sealer)

    def stream_headers(self) -> dict[str, str]:
        return {"request-id": new_id("req_")}

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        return HttpReply.json({"input_tokens": input_tokens}, headers={"request-id": new_id("req_")})

    def error_body(self, error: GatewayError, status: int) -> tuple[dict, dict[str, str]]:
        request_id = new_id("req_")
        return {"type": "error", "error": error_object(error), "request_id": request_id}, {"request-id": request_id}

    def model_card(self, name: str, window: int | None) -> dict[str, Any]:
        created = datetime.fromtimestamp(now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        card: dict[str, Any] = {"type": "model", "id": name, "display_name": name, "created_at": created,
                                "lifecycle": "active"}
        if window:
            card["max_input_tokens"] = window
        return card

    def render_models(self, models: list[str], window: int | None = None) -> HttpReply:
        return HttpReply.json(
            {
                "data": [self.model_card(m, window) for m in models],
                "has_more": False,
                "first_id": models[0] if models else None,
                "last_id": models[-1] if models else None,
            }
        )

__all__ = ["AnthropicContext", "AnthropicMessages"]
