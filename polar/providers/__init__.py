"""Provider detection: which of the four wire formats a request speaks.

Path first (each provider's `match`), so a body never has to be parsed to be routed; headers
only break the tie for side calls that several providers share (GET /v1/models).
A `ProviderSet` is built per capture database: the providers that mint reasoning seals share
that database's `Sealer`, so a seal from one database does not open in another.
"""

from __future__ import annotations

from polar.providers.anthropic import AnthropicMessages
from polar.providers.base import HttpReply, Parsed, Provider, Route
from polar.providers.gemini import GeminiGenerate
from polar.providers.openai_chat import OpenAIChat
from polar.providers.openai_responses import OpenAIResponses
from polar.providers.reasoning_seal import Sealer

_KINDS: tuple[type[Provider], ...] = (AnthropicMessages, OpenAIChat, OpenAIResponses, GeminiGenerate)
# The provider names, in detection order (also what harnesses name as the API they speak).
NAMES: tuple[str, ...] = tuple(kind.name for kind in _KINDS)


class ProviderSet:
    def __init__(self, sealer: Sealer):
        self.sealer = sealer
        self.all: list[Provider] = [kind(sealer) for kind in _KINDS]
        self.by_name: dict[str, Provider] = {p.name: p for p in self.all}

    def detect(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        for provider in self.all:
            route = provider.match(method, path, query, headers)
            if route is not None:
                return route
        return None

    def guess(self, path: str, headers: dict[str, str]) -> Provider:
        """The provider whose error shape an unroutable request most likely expects."""
        if "anthropic-version" in headers or "x-api-key" in headers or "/messages" in path:
            return self.by_name["anthropic"]
        if "x-goog-api-key" in headers or path.startswith("/v1beta") or ":generate" in path:
            return self.by_name["gemini"]
        if "/responses" in path:
            return self.by_name["openai_responses"]
        return self.by_name["openai_chat"]


__all__ = ["NAMES", "HttpReply", "Parsed", "Provider", "ProviderSet", "Route", "Sealer"]
