"""A live Anthropic Messages stream: message_start → content blocks → message_delta → message_stop.

Blocks open as the model gets to them (thinking, text, tool_use) and close when the next one starts;
the thinking block's signature goes out just before its content_block_stop, once the whole reasoning
is known, as the real API sends it. message_start waits for the prompt size (its usage carries
input_tokens); until then keep-alives are `ping` events, which the SDKs skip wherever they come.
"""

from __future__ import annotations

import json
from typing import Any

from polar.canonical import ChatRequest, ChatResult, Delta, ReasoningDelta, TextDelta, ToolCallDelta
from polar.errors import GatewayError
from polar.providers.anthropic.parse import AnthropicContext
from polar.providers.anthropic.render import error_object, stop_reason, usage
from polar.providers.base import object_of
from polar.providers.reasoning_seal import Sealer
from polar.providers.stream import StreamRenderer, sse_event


def _event(data: dict) -> bytes:
    return sse_event(data, event=data["type"])


_PING = _event({"type": "ping"})


class AnthropicStream(StreamRenderer):
    def __init__(self, context: AnthropicContext, request: ChatRequest, call_id: str, sealer: Sealer):
        self.message_id, self.model = f"msg_{call_id}", request.model
        self.omitted = context.thinking_display == "omitted"  # thinking text withheld, carried by the signature
        self.sealer = sealer
        self.started = False
        self.blocks = 0  # content blocks opened so far
        self.open: str | None = None  # kind of the open block
        self.open_call: int | None = None  # upstream index of the open tool_use block
        self.reasoning: list[str] = []
        self.answered = False  # a text or tool_use block was opened

    def opening(self, prompt_tokens: int | None) -> bytes:
        if self.started or prompt_tokens is None:
            return b""
        self.started = True
        # Cache reads are known only at the end: message_delta's usage carries the final split.
        first_usage = {"input_tokens": prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 0}
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": first_usage}
        return _event({"type": "message_start", "message": message})

    def delta(self, delta: Delta) -> bytes:
        out: list[bytes] = []
        if isinstance(delta, ReasoningDelta):
            if not delta.text:
                return b""
            if self.open != "thinking":
                out += self._open({"type": "thinking", "thinking": "", "signature": ""}, "thinking")
            self.reasoning.append(delta.text)
            if not self.omitted:
                out.append(self._delta({"type": "thinking_delta", "thinking": delta.text}))
        elif isinstance(delta, TextDelta):
            if not delta.text:
                return b""
            if self.open != "text":
                out += self._open({"type": "text", "text": ""}, "text")
            out.append(self._delta({"type": "text_delta", "text": delta.text}))
        else:
            out += self._tool(delta)
        return b"".join(out)

    def _tool(self, delta: ToolCallDelta) -> list[bytes]:
        out: list[bytes] = []
        if self.open != "tool_use" or self.open_call != delta.index:
            block = {"type": "tool_use", "id": delta.id or "", "name": delta.name or "", "input": {}}
            out += self._open(block, "tool_use")
            self.open_call = delta.index
            out.append(self._delta({"type": "input_json_delta", "partial_json": ""}))  # as the real API begins
        arguments = delta.arguments
        if delta.complete:  # a whole call: its input must read back as the object the JSON answer holds
            arguments = json.dumps(object_of(delta.arguments), ensure_ascii=False, separators=(",", ":"))
        if arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        if delta.complete:
            out += self._close()
        return out

    def finish(self, result: ChatResult) -> bytes:
        out = [self.opening(result.usage.prompt_tokens)]
        if not self.answered:  # the JSON answer always holds a text block when it has no tool call
            out += self._open({"type": "text", "text": ""}, "text")
        out += self._close()
        reason = stop_reason(result)
        delta = {"stop_reason": reason, "stop_sequence": result.stop_sequence if reason == "stop_sequence" else None}
        out.append(_event({"type": "message_delta", "delta": delta, "usage": usage(result)}))
        out.append(_event({"type": "message_stop"}))
        return b"".join(out)

    def keepalive(self) -> bytes:
        return _PING

    def error(self, error: GatewayError, status: int) -> bytes:
        return _event({"type": "error", "error": error_object(error)})

    # -- blocks ------------------------------------------------------------------------------

    def _open(self, block: dict[str, Any], kind: str) -> list[bytes]:
        out = self._close()
        out.append(_event({"type": "content_block_start", "index": self.blocks, "content_block": block}))
        if self.blocks == 0:
            out.append(_PING)  # right after the first block opens, as the real API does
        self.blocks += 1
        self.open = kind
        self.answered = self.answered or kind != "thinking"
        return out

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            text = "".join(self.reasoning)
            signature = self.sealer.seal(text) if self.omitted else self.sealer.sign(text)
            out.append(self._delta({"type": "signature_delta", "signature": signature}))
        out.append(_event({"type": "content_block_stop", "index": self.blocks - 1}))
        self.open = self.open_call = None
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})

