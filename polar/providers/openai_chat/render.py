"""Canonical result → a Chat Completions answer (`chat.completion`), and the pieces its stream shares."""

from __future__ import annotations

from typing import Any

from polar.canonical import ChatRequest, ChatResult


def finish_reason(result: ChatResult) -> str:
    if result.finish_reason == "stop_sequence":
        return "stop"
    if result.tool_calls and result.finish_reason == "stop":
        return "tool_calls"  # harnesses loop on tool_calls; a parser that said "stop" must not end the turn
    return result.finish_reason


def usage(result: ChatResult) -> dict:
    u = result.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    }


def reasoning_fields(text: str) -> dict:
    return {"reasoning": text, "reasoning_content": text}


def completion(request: ChatRequest, result: ChatResult) -> dict:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": result.content if result.content or not result.tool_calls else None,
        "refusal": None,
    }
    if result.reasoning and result.reasoning.text:
        message.update(reasoning_fields(result.reasoning.text))
    if result.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in result.tool_calls
        ]
    return {
        "id": f"chatcmpl-{result.id}",
        "object": "chat.completion",
        "created": result.created,
        "model": request.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(result)}],
        "usage": usage(result),
    }


