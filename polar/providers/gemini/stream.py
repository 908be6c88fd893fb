"""A live Gemini stream: one `GenerateContentResponse` chunk per piece, `finishReason` on the last.

Each chunk goes out one piece late, so the last one can carry the finishReason and the final usage
exactly as the JSON answer's chunking does (Gemini CLI retries a stream whose last chunk has none).
Function calls are whole parts (the API has no argument deltas): a call goes out once complete.
The sealed reasoning rides on the first answer text part and on the first call (`answer_parts`).

Keep-alives are blank lines, not SSE comments: Gemini CLI's bundled SDK matches `^\\s*data: ` at
the head of its buffer and would stall on a comment; whitespace it skips. Without `alt=sse` the
stream is one JSON array, written element by element.
"""

from __future__ import annotations

from typing import Any

from polar.canonical import ChatRequest, ChatResult, Delta, ReasoningDelta, TextDelta, ToolCallDelta
from polar.errors import GatewayError
from polar.json_values import compact
from polar.providers.base import object_of
from polar.providers.gemini.parse import GeminiContext
from polar.providers.gemini.render import chunk_usage, envelope_of, error_object, finish_reason, signature
from polar.providers.reasoning_seal import Sealer
from polar.providers.stream import StreamRenderer, sse_event


class GeminiStream(StreamRenderer):
    def __init__(self, context: GeminiContext, request: ChatRequest, call_id: str, sealer: Sealer, *,
                 sse: bool, code_assist: bool):
        self.context, self.model, self.call_id, self.sealer = context, request.model, call_id, sealer
        self.sse, self.code_assist = sse, code_assist
        self.content_type = "text/event-stream; charset=utf-8" if sse else "application/json"
        self.prompt_tokens = 0
        self.started = False
        self.reasoning: list[str] = []
        self.signed_text = self.signed_call = False
        self.held: list[dict[str, Any]] | None = None  # the parts of the chunk not yet sent
        self.calls: dict[int, list] = {}  # upstream index → [id, name, argument pieces] of a call not yet sent
        self.written = 0  # chunks written (the JSON array needs commas between them)

    def opening(self, prompt_tokens: int | None) -> bytes:
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if self.started:
            return b""
        self.started = True
        return b"" if self.sse else b"["

    def keepalive(self) -> bytes:
        return b"\n"

    def delta(self, delta: Delta) -> bytes:
        out = self.opening(None)
        if isinstance(delta, ReasoningDelta):
            if not delta.text:
                return out
            self.reasoning.append(delta.text)
            if self.context.include_thoughts:
                out += self._hold([{"text": delta.text, "thought": True}])
        elif isinstance(delta, TextDelta):
            if not delta.text:
                return out
            out += self._calls_done()  # text after a call: the call is complete
            part: dict[str, Any] = {"text": delta.text}
            if not self.signed_text and self.reasoning:
                part["thoughtSignature"], self.signed_text = self._signature(), True
            out += self._hold([part])
        else:
            out += self._call(delta)
        return out

    def _call(self, delta: ToolCallDelta) -> bytes:
        out = b""
        if delta.index not in self.calls:
            out += self._calls_done()  # the previous call ends where this one starts
            self.calls[delta.index] = [delta.id or "", delta.name or "", []]
        self.calls[delta.index][2].append(delta.arguments)
        if delta.complete:
            out += self._calls_done()
        return out

    def _calls_done(self) -> bytes:
        parts = []
        for call_id, name, pieces in self.calls.values():
            part: dict[str, Any] = {"functionCall": {"id": call_id, "name": name, "args": object_of("".join(pieces))}}
            if not self.signed_call and self.reasoning:
                part["thoughtSignature"], self.signed_call = self._signature(), True
            parts.append(part)
        self.calls.clear()
        return self._hold(parts) if parts else b""

    def finish(self, result: ChatResult) -> bytes:
        self.opening(result.usage.prompt_tokens)
        pending = self._calls_done()  # flushes the chunk before them; theirs is now held
        parts, self.held = self.held or [], None
        # A turn with no parts at all still ends with one chunk carrying the finishReason.
        last = self._chunk(parts, result)
        return self.opening(None) + pending + last + (b"" if self.sse else b"]")

    def error(self, error: GatewayError, status: int) -> bytes:
        body = {"error": error_object(error, status)}
        return sse_event(body) if self.sse else (b"," if self.written else b"") + compact(body) + b"]"

    # -- chunks ----------------------------------------------------------------------------

    def _hold(self, parts: list[dict[str, Any]]) -> bytes:
        """Hold these parts back as the next chunk; send the one held before them."""
        previous, self.held = self.held, parts
        return self._chunk(previous, None) if previous is not None else b""

    def _chunk(self, parts: list[dict[str, Any]], result: ChatResult | None) -> bytes:
        content: dict[str, Any] = {"role": "model"}
        if parts:  # the real API leaves out `parts` rather than sending an empty list
            content["parts"] = parts
        candidate: dict[str, Any] = {"content": content}
        if result is not None:
            candidate["finishReason"] = finish_reason(result)
        candidate["index"] = 0
        usage = chunk_usage(result) if result is not None else _prompt_usage(self.prompt_tokens)
        chunk = {"candidates": [candidate], "usageMetadata": usage, "modelVersion": self.model,
                 "responseId": self.call_id}
        body = envelope_of(self.code_assist, self.call_id, chunk)
        self.written += 1
        if self.sse:
            return sse_event(body)
        return (b"," if self.written > 1 else b"") + compact(body)

    def _signature(self) -> str:
        return signature("".join(self.reasoning), self.sealer)


def _prompt_usage(prompt_tokens: int) -> dict[str, Any]:
    """Usage before the end: the prompt is known, output counts arrive with the last chunk."""
    details = [{"modality": "TEXT", "tokenCount": prompt_tokens}]
    return {"promptTokenCount": prompt_tokens, "totalTokenCount": prompt_tokens, "promptTokensDetails": details}
