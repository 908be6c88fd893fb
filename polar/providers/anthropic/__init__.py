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
from polar.providers.anthropic.render import message, stream
from polar.providers.base import (
    HttpReply,
    Parsed,
    Provider,
    Route,
    bare_path,
    new_id,
    now,
)

_GENERATE_PATH = "/v1/messages"
_COUNT_PATH = "/v1/messages/count_tokens"

# kind -> (Anthropic error type, status). Overloaded is 529 on this API, not 503.
_ERRORS: dict[str, tuple[str, int]] = {
    "invalid_request": ("invalid_request_error", 400),
    "context_length": ("invalid_request_error", 400),
    "authentication": ("authentication_error", 401),
    "permission": ("permission_error", 403),
    "not_found": ("not_found_error", 404),
    "too_large": ("request_too_large", 413),
    "rate_limit": ("rate_limit_error", 429),
    "upstream_unavailable": ("overloaded_error", 529),
    "upstream_timeout": ("timeout_error", 504),
    "upstream_error": ("api_error", 502),
    "internal": ("api_error", 500),
}

# Claude Code looks for this prefix to decide that a conversation needs compacting.
_CONTEXT_PREFIX = "prompt is too long"


class AnthropicMessages(Provider[AnthropicContext]):
    name = "anthropic"
    statuses: ClassVar[dict[str, int]] = {kind: status for kind, (_, status) in _ERRORS.items()}

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        if method.upper() != "POST":
            return None
        path = bare_path(path)
        if path.endswith(_COUNT_PATH):
            return Route(self, "count_tokens", query=dict(query))
        if path.endswith(_GENERATE_PATH):
            return Route(self, "generate", query=dict(query))
        return None

    def parse(self, route: Route, body: Any) -> Parsed[AnthropicContext]:
        return parse_request(route, body, self.sealer)

    def render(self, route: Route, context: AnthropicContext, request: ChatRequest, result: ChatResult) -> HttpReply:
        answer = message(context, request, result, self.sealer)
        headers = {"request-id": new_id("req_")}
        if not request.stream:
            return HttpReply.json(answer, headers=headers)
        return HttpReply.sse(stream(answer), headers=headers)

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        return HttpReply.json({"input_tokens": input_tokens}, headers={"request-id": new_id("req_")})

    def error_body(self, error: GatewayError, status: int) -> tuple[dict, dict[str, str]]:
        message = error.message
        if error.kind == "context_length" and not message.startswith(_CONTEXT_PREFIX):
            message = f"{_CONTEXT_PREFIX}: {message}"
        request_id = new_id("req_")
        body = {"type": "error", "error": {"type": _ERRORS[error.kind][0], "message": message}, "request_id": request_id}
        return body, {"request-id": request_id}

    def render_models(self, models: list[str]) -> HttpReply:
        created = datetime.fromtimestamp(now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        data = [
            {"type": "model", "id": m, "display_name": m, "created_at": created, "lifecycle": "active"} for m in models
        ]
        return HttpReply.json(
            {
                "data": data,
                "has_more": False,
                "first_id": models[0] if models else None,
                "last_id": models[-1] if models else None,
            }
        )


__all__ = ["AnthropicContext", "AnthropicMessages"]
