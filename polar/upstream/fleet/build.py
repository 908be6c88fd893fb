"""The gateway's backend from its settings: one upstream as it always was, or several as a fleet."""

from __future__ import annotations

from collections.abc import Sequence

from polar.upstream.base import Backend
from polar.upstream.fleet.backend import FleetBackend
from polar.upstream.vllm_chat import VLLMChat


def upstream_backend(urls: Sequence[str], *, model: str | None = None, api_key: str | None = None,
                     timeout: float = 600.0, chat_template: str | None = None, tokenizer: str | None = None,
                     endpoint: str = "auto", imbalance: float = 1.5, probe_interval: float = 2.0,
                     stall: float = 0.0) -> Backend:
    """A backend per URL (token-faithful when a tokenizer is given: one template, loaded once, for all); more
    than one URL makes a fleet of them (every replica serves the same model). `stall`: seconds an answer may
    bring no byte before the replica's health probe decides whether it stalled (0: only `timeout`)."""
    if not urls:
        raise ValueError("no upstream URL given")
    chats = [VLLMChat(url, model=model, api_key=api_key, timeout=timeout, chat_template=chat_template, stall=stall)
             for url in urls]
    backends: list[Backend] = list(chats)
    if tokenizer:
        from polar.tokens.template import ChatTemplate
        from polar.upstream.vllm_tokens import TokenFaithful

        template = ChatTemplate.from_dir(tokenizer, chat_template)
        template.prepare_long_text()
        backends = [TokenFaithful(chat, template, endpoint) for chat in chats]
    if len(backends) == 1:
        return backends[0]  # one upstream: no fleet in between
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    return FleetBackend(list(zip(urls, backends, strict=True)), imbalance, probe_interval, probe_headers=headers)
