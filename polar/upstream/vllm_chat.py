"""The vLLM upstream, spoken to through its OpenAI-compatible chat endpoint.

vLLM applies the model's chat template and its tool/reasoning parsers; polar asks it for the
token-level truth alongside (`return_token_ids`, `logprobs`) so the capture holds exactly the
ids the engine saw and sampled. Every failure becomes a `GatewayError` whose kind says whose
fault it was, so each provider can answer in its own error shape.
"""

from __future__ import annotations

import functools
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np

from polar.canonical import ChatRequest, ChatResult, ToolCall
from polar.errors import GatewayError
from polar.sessions.state import SessionView
from polar.tokens.messages import to_openai_messages, to_openai_tools
from polar.tokens.shaping import TemplateTraits
from polar.upstream.chat_stream import ChatStream
from polar.upstream.http import StreamRequest, UpstreamHTTP
from polar.upstream.prompt_ids import read_chat_answer
from polar.upstream.results import chat_result, token_array


class VLLMChat:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        max_connections: int = 1024,
        chat_template: str | None = None,
        stall: float = 0.0,
    ):
        self.base_url = base_url.rstrip("/")
        # The template vLLM serves with, when the user told polar (`polar_chat_template`): shaping uses it.
        self.chat_template = chat_template
        self._model = model
        self._window: int | None = None
        self.http = UpstreamHTTP(base_url, api_key=api_key, timeout=timeout, max_connections=max_connections,
                                 stall=stall)

    async def aclose(self) -> None:
        await self.http.aclose()

    # -- model -----------------------------------------------------------------------------

    @property
    def served_model(self) -> str | None:
        """The model name, once known (configured or learnt from the upstream)."""
        return self._model

    async def model(self) -> str:
        """The served model name: configured, or the first one the upstream lists."""
        if self._model is None:
            listing = await self.http.call("GET", "/v1/models")
            try:
                self._model = listing["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise GatewayError("upstream_error", "the upstream's /v1/models lists no model") from None
        return self._model

    async def context_length(self) -> int | None:
        """The served model's context window (`max_model_len` on vLLM's listing), None when not listed."""
        if self._window is None:
            listing = await self.http.call("GET", "/v1/models")
            cards = listing.get("data", []) if isinstance(listing, dict) else []
            self._window = next((c["max_model_len"] for c in cards
                                 if isinstance(c, dict) and isinstance(c.get("max_model_len"), int)), 0)
        return self._window or None

    @functools.cached_property
    def _traits(self) -> TemplateTraits | None:
        if not self.chat_template:
            return None
        return TemplateTraits.of(Path(self.chat_template).read_text(), Path(self.chat_template).stem)

    def template_traits(self) -> TemplateTraits | None:
        return self._traits  # read and probed once, not per request

    # -- calls -----------------------------------------------------------------------------

    async def complete(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> ChatResult:
        body = await self.chat_body(request)
        started = time.time()
        known = previous_ids(session)
        data = await self.http.call("POST", "/v1/chat/completions", body, read=lambda raw: read_chat_answer(raw, known))
        return parse_chat_completion(data, call_id, request, started)

    async def stream(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> ChatStream:
        body = await self.chat_body(request)
        body.update(stream=True, stream_options={"include_usage": True})
        return ChatStream(StreamRequest(self.http, "/v1/chat/completions", body), request, call_id, previous_ids(session))

    async def count_tokens(self, request: ChatRequest) -> int:
        body = await self.chat_body(request)
        keep = ("model", "messages", "tools", "chat_template_kwargs")
        data = await self.http.call("POST", "/tokenize", {k: body[k] for k in keep if k in body})
        if not isinstance(data, dict) or not isinstance(data.get("count"), int):
            raise GatewayError("upstream_error", "the upstream's /tokenize answer has no token count")
        return data["count"]

    async def chat_body(self, request: ChatRequest) -> dict[str, Any]:
        traits = self.template_traits()
        if traits and traits.vllm_tool_call_error and any(m.tool_calls for m in request.messages):
            raise GatewayError("invalid_request", f"{traits.label} cannot be rendered by vLLM's chat endpoint once the "
                               f"conversation holds a tool call ({traits.vllm_tool_call_error}); polar's token-faithful "
                               "mode renders it (start polar with the model's tokenizer)")
        s = request.sampling
        body: dict[str, Any] = {
            "model": await self.model(),
            "messages": [m for msg in request.messages for m in to_openai_messages(msg)],
            "return_token_ids": True,
            "logprobs": True,
            "stream": False,
        }
        if request.tools:
            body["tools"] = to_openai_tools(request.tools)
            choice = request.tool_choice
            body["tool_choice"] = (
                {"type": "function", "function": {"name": choice.name}} if choice.mode == "tool" else choice.mode
            )
            if request.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = request.parallel_tool_calls
        for key in ("max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty"):
            value = getattr(s, key)
            if value is not None:
                body[key] = value
        if s.stop:
            body["stop"] = s.stop
        if request.thinking.enabled is not None:
            body["chat_template_kwargs"] = {"enable_thinking": request.thinking.enabled}
        if request.response_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": request.response_schema}}
        return body


def previous_ids(session: SessionView | None) -> np.ndarray | None:
    """The ids of the session's newest turn: what vLLM's prompt ids most likely start with (read_chat_answer)."""
    return session.state.turns[-1].ids.array() if session is not None and session.state.turns else None


def parse_chat_completion(data: Any, call_id: str, request: ChatRequest, started: float) -> ChatResult:
    """A vLLM chat completion (with token ids) → ChatResult. Malformed answers are upstream errors."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        completion_ids = list(choice.get("token_ids") or [])
        prompt_ids = token_array(data.get("prompt_token_ids"), "prompt_token_ids")
        logprob_items = (choice.get("logprobs") or {}).get("content") or []
        tool_calls = [
            ToolCall(
                id=tc.get("id") or f"call_{secrets.token_hex(12)}",
                name=tc["function"]["name"],
                arguments=tc["function"].get("arguments") or "{}",
            )
            for tc in (message.get("tool_calls") or [])
        ]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise GatewayError(
            "upstream_error", f"the upstream's answer is not a chat completion with token ids ({type(exc).__name__}: {exc})"
        ) from None
    return chat_result(
        call_id, request, model=data.get("model") or "", created=int(data.get("created") or started),
        content=message.get("content") or "", reasoning=message.get("reasoning") or message.get("reasoning_content"),
        tool_calls=tool_calls, finish=choice.get("finish_reason"), stop_reason=choice.get("stop_reason"),
        usage=data.get("usage") or {}, prompt_ids=prompt_ids, completion_ids=completion_ids,
        logprobs=[item.get("logprob") for item in logprob_items],
    )
