"""Canonical result → an Anthropic Message (the JSON answer), its stop reason, usage and error objects.

The live stream (stream.py) shares these, so both shapes always agree.
"""

from __future__ import annotations

from polar.canonical import ChatRequest, ChatResult, Reasoning
from polar.errors import GatewayError
from polar.providers.anthropic.parse import AnthropicContext
from polar.providers.base import arguments_object
from polar.providers.reasoning_seal import Sealer

# kind -> (Anthropic error type, status). Overloaded is 529 on this API, not 503.
ERRORS: dict[str, tuple[str, int]] = {
    "invalid_request": ("invalid_request_error", 400),
    "context_length": ("invalid_request_error", 400),
    "authentication": ("authentication_error", 401),
    "permission": ("permission_error", 403),
    "not_found": ("not_found_error", 404),
    "too_large": ("request_too_large", 413),
    "rate_limit": ("rate_limit_error", 429),
    "upstream_unavailable": ("overloaded_error", 529),
    "upstream_timeout": ("timeout_error", 504),
    "upstream_error": ("api_error", 502),
    "internal": ("api_error", 500),
    "stopping": ("overloaded_error", 529),  # the SDKs retry it
}

# Claude Code looks for this prefix to decide that a conversation needs compacting.
_CONTEXT_PREFIX = "prompt is too long"

_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "stop_sequence": "stop_sequence",
    "content_filter": "refusal",
}


def message(context: AnthropicContext, request: ChatRequest, result: ChatResult, sealer: Sealer) -> dict:
    """The Message object the non-streamed answer is."""
    reason = stop_reason(result)
    return {
        "id": f"msg_{result.id}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": _content_blocks(context, result, sealer),
        "stop_reason": reason,
        "stop_sequence": result.stop_sequence if reason == "stop_sequence" else None,
        "usage": usage(result),
    }


def stop_reason(result: ChatResult) -> str:
    return _STOP_REASON[result.finish_reason]


def error_object(error: GatewayError) -> dict:
    """The `error` member of an error answer or an in-stream error event."""
    message = error.message
    if error.kind == "context_length" and not message.startswith(_CONTEXT_PREFIX):
        message = f"{_CONTEXT_PREFIX}: {message}"
    return {"type": ERRORS[error.kind][0], "message": message}


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


def usage(result: ChatResult) -> dict:
    # Anthropic's input_tokens excludes cache reads: total input = input + cache read + cache creation.
    cached = result.usage.cached_tokens
    return {
        "input_tokens": max(result.usage.prompt_tokens - cached, 0),
        "output_tokens": result.usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }
