"""A live Responses stream: response.created … one item at a time … response.completed.

Items open as the model gets to them and close when the next one starts, so a client (Codex builds
its history and runs tools from `response.output_item.done`) can act on each at once: a reasoning
item, a message item, then function calls. Reasoning streams as both summary and raw reasoning text,
the two forms the answer carries. Custom-tool calls (`apply_patch`) go out whole, once their input is
complete. `response.completed` lists the items exactly as they were streamed.

While the upstream is silent (queue, prefill) the keep-alive is a repeated `response.in_progress`:
Codex's idle timer counts events, not bytes, so an SSE comment would not keep it waiting.
"""

from __future__ import annotations

from typing import Any

from polar.canonical import ChatRequest, ChatResult, Delta, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta
from polar.errors import GatewayError
from polar.providers.openai_common import error_body
from polar.providers.openai_responses.parse import ResponsesContext
from polar.providers.openai_responses.render import (
    custom_call_item,
    function_call_item,
    item_status,
    reasoning_item,
    response_object,
)
from polar.providers.reasoning_seal import Sealer
from polar.providers.stream import StreamRenderer, sse_event


class ResponsesStream(StreamRenderer):
    def __init__(self, context: ResponsesContext, request: ChatRequest, call_id: str, sealer: Sealer):
        self.context, self.request, self.call_id, self.sealer = context, request, call_id, sealer
        self.sequence = 0
        self.started = False
        self.items: list[dict[str, Any]] = []  # finished items, as streamed
        self.open: dict[str, Any] | None = None  # the item being streamed: {"kind", "index", "item", "text"…}
        self.messages = 0

    # -- the stream's lifecycle --------------------------------------------------------------------

    def opening(self, prompt_tokens: int | None) -> bytes:
        if self.started:
            return b""
        self.started = True
        opened = self._response(final=None)
        return self._emit("response.created", response=opened) + self._emit("response.in_progress", response=opened)

    def keepalive(self) -> bytes:
        return self._emit("response.in_progress", response=self._response(final=None))

    def delta(self, delta: Delta) -> bytes:
        out = self.opening(None)
        if isinstance(delta, ReasoningDelta):
            if delta.text:
                out += self._reasoning(delta.text)
        elif isinstance(delta, TextDelta):
            if delta.text:
                out += self._text(delta.text)
        else:
            out += self._call(delta)
        return out

    def finish(self, result: ChatResult) -> bytes:
        out = self.opening(None) + self._close(item_status(result))
        final = self._response(final=result)
        # A length cut still ends with `response.completed` (its response says status "incomplete" and
        # why): Codex and the SDK's stream helper accept no other terminal event, and would otherwise
        # treat a truncated turn as a dropped stream and retry it.
        return out + self._emit("response.completed", response=final)

    def error(self, error: GatewayError, status: int) -> bytes:
        failed = {**self._response(final=None), "status": "failed", "error": {
            "code": error_body(error)["error"]["code"] or "server_error", "message": error.message}}
        return self._emit("response.failed", response=failed)

    # -- items ------------------------------------------------------------------------------------

    def _reasoning(self, text: str) -> bytes:
        out = b""
        if self.open is None or self.open["kind"] != "reasoning":
            out += self._close("completed")
            at = self._start("reasoning", {"type": "reasoning", "id": f"rs_{self.call_id}", "summary": []})
            out += self._added(at)
            out += self._emit("response.reasoning_summary_part.added", **at["where"], summary_index=0,
                              part={"type": "summary_text", "text": ""})
            out += self._emit("response.content_part.added", **at["where"], content_index=0,
                              part={"type": "reasoning_text", "text": ""})
        at = self.open
        at["text"].append(text)
        out += self._emit("response.reasoning_summary_text.delta", **at["where"], summary_index=0, delta=text)
        return out + self._emit("response.reasoning_text.delta", **at["where"], content_index=0, delta=text)

    def _text(self, text: str) -> bytes:
        out = b""
        if self.open is None or self.open["kind"] != "message":
            out += self._close("completed")
            item_id = f"msg_{self.call_id}" + (f"_{self.messages}" if self.messages else "")
            self.messages += 1
            item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
            at = self._start("message", item)
            out += self._added(at)
            out += self._emit("response.content_part.added", **at["where"], content_index=0,
                              part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        at = self.open
        at["text"].append(text)
        return out + self._emit("response.output_text.delta", **at["where"], content_index=0, delta=text, logprobs=[])

    def _call(self, delta: ToolCallDelta) -> bytes:
        out = b""
        at = self.open
        if at is None or at["kind"] not in ("call", "custom") or at["call"] != delta.index:
            out += self._close("completed")
            name = delta.name or ""
            custom = name in self.context.custom_tools
            call = ToolCall(id=delta.id or "", name=name)
            at = self._start("custom" if custom else "call", None)
            at.update(call=delta.index, tool=call)
            if not custom:  # custom calls go out whole, when their input is known
                at["item"] = function_call_item(self.call_id, len(self.items), call, "in_progress")
                out += self._added(at)
        at["text"].append(delta.arguments)
        if delta.arguments and at["kind"] == "call":
            out += self._emit("response.function_call_arguments.delta", **at["where"], delta=delta.arguments)
        if delta.complete:
            out += self._close("completed")
        return out

    def _start(self, kind: str, item: dict[str, Any] | None) -> dict[str, Any]:
        index = len(self.items)
        self.open = {"kind": kind, "item": item, "text": [], "where": {"output_index": index}}
        if item is not None:
            self.open["where"]["item_id"] = item["id"]
        return self.open

    def _added(self, at: dict[str, Any]) -> bytes:
        return self._emit("response.output_item.added", output_index=at["where"]["output_index"], item=at["item"])

    def _close(self, status: str) -> bytes:
        """Finish the open item: its `.done` events, then `output_item.done` with the whole item."""
        at, self.open = self.open, None
        if at is None:
            return b""
        text = "".join(at["text"])
        where = at["where"]
        out = b""
        if at["kind"] == "reasoning":
            item = reasoning_item(self.context, self.call_id, text, self.sealer)
            out += self._emit("response.reasoning_summary_text.done", **where, summary_index=0, text=text)
            out += self._emit("response.reasoning_summary_part.done", **where, summary_index=0,
                              part=item["summary"][0])
            out += self._emit("response.reasoning_text.done", **where, content_index=0, text=text)
            out += self._emit("response.content_part.done", **where, content_index=0, part=item["content"][0])
        elif at["kind"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item = {**at["item"], "status": status, "content": [part]}
            out += self._emit("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            out += self._emit("response.content_part.done", **where, content_index=0, part=part)
        elif at["kind"] == "call":
            call = at["tool"].model_copy(update={"arguments": text})
            item = function_call_item(self.call_id, where["output_index"], call, status)
            out += self._emit("response.function_call_arguments.done", **where, name=call.name, arguments=text)
        else:  # a custom tool call, announced and finished at once
            call = at["tool"].model_copy(update={"arguments": text})
            item = custom_call_item(self.call_id, where["output_index"], call)
            at["item"], where["item_id"] = {**item, "input": ""}, item["id"]
            out += self._added(at)
            out += self._emit("response.custom_tool_call_input.delta", **where, delta=item["input"])
            out += self._emit("response.custom_tool_call_input.done", **where, input=item["input"])
        self.items.append(item)
        return out + self._emit("response.output_item.done", output_index=where["output_index"], item=item)

    # -- events ------------------------------------------------------------------------------------

    def _response(self, final: ChatResult | None) -> dict[str, Any]:
        return response_object(self.context, self.request, self.call_id, final, self.items if final else [])

    def _emit(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(event, event=kind)
