"""Provider detection: which of the four wire formats a request speaks.

Path first (each provider's `match`), so a body never has to be parsed to be routed; headers
only break the tie for side calls that several providers share (GET /v1/models).
"""

from __future__ import annotations

from polar.providers.anthropic import AnthropicMessages
from polar.providers.base import HttpReply, Provider, Route
from polar.providers.gemini import GeminiGenerate
from polar.providers.openai_chat import OpenAIChat
from polar.providers.openai_responses import OpenAIResponses

PROVIDERS: list[Provider] = [AnthropicMessages(), OpenAIChat(), OpenAIResponses(), GeminiGenerate()]
BY_NAME: dict[str, Provider] = {p.name: p for p in PROVIDERS}


def detect(method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
    for provider in PROVIDERS:
        route = provider.match(method, path, query, headers)
        if route is not None:
            return route
    return None


def guess(path: str, headers: dict[str, str]) -> Provider:
    """The provider whose error shape an unroutable request most likely expects."""
    if "anthropic-version" in headers or "x-api-key" in headers or "/messages" in path:
        return BY_NAME["anthropic"]
    if "x-goog-api-key" in headers or path.startswith("/v1beta") or ":generate" in path:
        return BY_NAME["gemini"]
    if "/responses" in path:
        return BY_NAME["openai_responses"]
    return BY_NAME["openai_chat"]


__all__ = ["PROVIDERS", "BY_NAME", "detect", "guess", "HttpReply", "Provider", "Route"]
