"""What the gateway needs from an upstream: the model name, one sampled turn, a token count."""

from __future__ import annotations

from typing import Protocol

from polar.canonical import ChatRequest, ChatResult
from polar.sessions.state import SessionView
from polar.tokens.shaping import TemplateTraits


class Backend(Protocol):
    async def model(self) -> str: ...

    async def complete(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> ChatResult:
        """Sample one assistant turn. `session` is the call's session state (read only: the gateway
        updates it once the capture has committed)."""
        ...

    async def count_tokens(self, request: ChatRequest) -> int: ...

    def template_traits(self) -> TemplateTraits | None:
        """What the served model's chat template accepts, when polar knows the template."""
        ...

    async def aclose(self) -> None: ...
