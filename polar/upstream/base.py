"""What the gateway needs from an upstream: the model name, one sampled turn (whole or streamed), a token count."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from polar.canonical import ChatRequest, ChatResult, Delta
from polar.sessions.state import SessionView
from polar.tokens.shaping import TemplateTraits


class UpstreamStream(Protocol):
    """One turn as the upstream samples it. `accepted` waits up to `timeout` for the upstream to take the
    request (True), or says it still works on it (False); a refusal raises GatewayError. Iterating yields
    the deltas each upstream chunk brought (maybe none); a failure (a late refusal included) raises
    GatewayError. `result` once it has ended; `partial` after it broke off or was closed; `aclose` aborts
    the upstream request (vLLM frees the sequence)."""

    @property
    def prompt_tokens(self) -> int | None: ...

    async def accepted(self, timeout: float | None) -> bool: ...

    def __aiter__(self) -> AsyncIterator[list[Delta]]: ...

    def result(self) -> ChatResult: ...

    def partial(self) -> ChatResult: ...

    async def aclose(self) -> None: ...


class Backend(Protocol):
    async def model(self) -> str: ...

    async def complete(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> ChatResult:
        """Sample one assistant turn. `session` is the call's session state (read only: the gateway
        updates it once the capture has committed)."""
        ...

    async def stream(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> UpstreamStream:
        """Start sampling one turn as a stream (the request is sent; `accepted` says when the upstream took it)."""
        ...

    async def count_tokens(self, request: ChatRequest) -> int: ...

    async def context_length(self) -> int | None:
        """The served model's context window, None when the upstream does not say (model listings and probes)."""
        ...

    def template_traits(self) -> TemplateTraits | None:
        """What the served model's chat template accepts, when polar knows the template."""
        ...

    async def aclose(self) -> None: ...
