"""A live Chat Completions stream: `chat.completion.chunk`s, a finish chunk, the usage chunk, `[DONE]`.

The role chunk goes out at once (it needs no counts). Reasoning travels under both names the answer
uses (`reasoning`, `reasoning_content`); a tool call opens with its id and name and then streams its
arguments text, as OpenAI's own API does.
"""

from __future__ import annotations

import time
from typing import Any

from polar.canonical import ChatRequest, ChatResult, Delta, ReasoningDelta, TextDelta
from polar.errors import GatewayError
from polar.providers.openai_chat.parse import ChatContext
from polar.providers.openai_chat.render import finish_reason, reasoning_fields, usage
from polar.providers.openai_common import error_body
from polar.providers.stream import StreamRenderer, sse_event

_DONE = sse_event("[DONE]")


class ChatStream(StreamRenderer):
    def __init__(self, context: ChatContext, request: ChatRequest, call_id: str):
        self.head = {"id": f"chatcmpl-{call_id}", "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": request.model}
        self.with_usage = context.include_usage
        self.started = False
        self.calls: set[int] = set()  # tool calls whose opening chunk went out

    def _chunk(self, delta: dict[str, Any], reason: str | None = None) -> bytes:
        data = {**self.head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        if self.with_usage:  # with include_usage every chunk carries the key, null until the last one
            data["usage"] = None
        return sse_event(data)

    def opening(self, prompt_tokens: int | None) -> bytes:
        if self.started:
            return b""
        self.started = True
        return self._chunk({"role": "assistant", "content": ""})

    def delta(self, delta: Delta) -> bytes:
        if isinstance(delta, ReasoningDelta):
            return self._chunk(reasoning_fields(delta.text)) if delta.text else b""
        if isinstance(delta, TextDelta):
            return self._chunk({"content": delta.text}) if delta.text else b""
        out = b""
        if delta.index not in self.calls:
            self.calls.add(delta.index)
            function = {"name": delta.name or "", "arguments": ""}
            out = self._chunk({"tool_calls": [{"index": delta.index, "id": delta.id or "", "type": "function",
                                               "function": function}]})
        if delta.arguments:
            out += self._chunk({"tool_calls": [{"index": delta.index, "function": {"arguments": delta.arguments}}]})
        return out

    def finish(self, result: ChatResult) -> bytes:
        out = self.opening(None) + self._chunk({}, finish_reason(result))
        if self.with_usage:
            out += sse_event({**self.head, "choices": [], "usage": usage(result)})
        return out + _DONE

    def error(self, error: GatewayError, status: int) -> bytes:
        # The SDKs raise on a chunk holding an `error` object; no [DONE] follows a broken stream.
        return sse_event(error_body(error))
