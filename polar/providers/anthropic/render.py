"""Canonical result → an Anthropic Message, or the exact SSE event sequence that streams one.

The stream is derived from the same content blocks as the non-streamed answer, so both shapes
always agree.
"""

from __future__ import annotations

import json

from polar.canonical import ChatRequest, ChatResult, Reasoning
from polar.providers.anthropic.parse import AnthropicContext
from polar.providers.base import arguments_object
from polar.providers.reasoning_seal import Sealer
from polar.providers.stream import pieces, sse_event

# Longest streamed delta: small enough that clients really accumulate several deltas.
_TEXT_CHUNK = 64
_JSON_CHUNK = 32

_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "stop_sequence": "stop_sequence",
    "content_filter": "refusal",
}


def message(context: AnthropicContext, request: ChatRequest, result: ChatResult, sealer: Sealer) -> dict:
    """The Message object the non-streamed answer is, and the stream is derived from."""
    stop_reason = _STOP_REASON[result.finish_reason]
    return {
        "id": f"msg_{result.id}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": _content_blocks(context, result, sealer),
        "stop_reason": stop_reason,
        "stop_sequence": result.stop_sequence if stop_reason == "stop_sequence" else None,
        "usage": _usage(result),
    }


def _content_blocks(context: AnthropicContext, result: ChatResult, sealer: Sealer) -> list[dict]:
    blocks: list[dict] = []
    reasoning = result.reasoning
    if reasoning is not None and reasoning.redacted:
        blocks.append({"type": "redacted_thinking", "data": reasoning.text})
    elif reasoning is not None and reasoning.text:
        blocks.append(_thinking_out(reasoning, context.thinking_display == "omitted", sealer))
    if result.content or not result.tool_calls:
        blocks.append({"type": "text", "text": result.content})
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments_object(call)}
        for call in result.tool_calls
    )
    return blocks


def _thinking_out(reasoning: Reasoning, omitted: bool, sealer: Sealer) -> dict:
    if omitted:
        # The client gets no text, so the signature must carry it back to polar next turn.
        return {"type": "thinking", "thinking": "", "signature": sealer.seal(reasoning.text)}
    signature = reasoning.signature or sealer.sign(reasoning.text)
    return {"type": "thinking", "thinking": reasoning.text, "signature": signature}


def _usage(result: ChatResult) -> dict:
    # Anthropic's input_tokens excludes cache reads: total input = input + cache read + cache creation.
    cached = result.usage.cached_tokens
    return {
        "input_tokens": max(result.usage.prompt_tokens - cached, 0),
        "output_tokens": result.usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def stream(message: dict) -> bytes:
    usage = message["usage"]
    opening = {"content": [], "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 0}}
    start = {**message, **opening}
    events = [_event({"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        block_events = _block_events(index, block)
        if index == 0:
            block_events.insert(1, _event({"type": "ping"}))  # right after the first block opens, as the real API does
        events.extend(block_events)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    events.append(_event({"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(_event({"type": "message_stop"}))
    return b"".join(events)


def _block_events(index: int, block: dict) -> list[bytes]:
    """content_block_start (the empty block), its deltas, and content_block_stop."""
    kind = block["type"]
    if kind == "thinking":
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": c} for c in pieces(block["thinking"], _TEXT_CHUNK)]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "text":
        empty = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": c} for c in pieces(block["text"], _TEXT_CHUNK)]
    elif kind == "tool_use":
        empty = {**block, "input": {}}
        arguments = json.dumps(block["input"], ensure_ascii=False, separators=(",", ":"))
        # Like the real API: an empty first fragment, then the JSON text in pieces.
        deltas = [{"type": "input_json_delta", "partial_json": c} for c in ["", *pieces(arguments, _JSON_CHUNK)]]
    else:  # redacted_thinking arrives whole in its start event
        empty, deltas = block, []
    start = _event({"type": "content_block_start", "index": index, "content_block": empty})
    body = [_event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
    return [start, *body, _event({"type": "content_block_stop", "index": index})]


def _event(data: dict) -> bytes:
    return sse_event(data, event=data["type"])
