"""Canonical result → Gemini `GenerateContentResponse`s: one answer, or the chunks of a stream."""

from __future__ import annotations

import base64
from typing import Any

from polar.canonical import ChatRequest, ChatResult
from polar.providers.base import Route, arguments_object
from polar.providers.gemini.parse import GeminiContext
from polar.providers.reasoning_seal import Sealer
from polar.providers.stream import pieces

# Gemini ends a tool-calling turn with plain STOP; it has no tool-specific finish reason.
_FINISH = {
    "stop": "STOP",
    "tool_calls": "STOP",
    "stop_sequence": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
}

# Longest streamed text piece; each piece goes out as one chunk.
_PIECE_CHARS = 64


def answer_parts(context: GeminiContext, result: ChatResult, sealer: Sealer, stream: bool) -> list[dict[str, Any]]:
    """Response parts in order: thoughts (when asked for), text, function calls.

    Text is cut into pieces when streaming. The sealed reasoning rides on the first function
    call, else the first text piece — the parts a client keeps in its history (Gemini CLI
    merges consecutive text parts into the first one, dropping later parts' other fields).
    """
    reasoning = result.reasoning.text if result.reasoning else ""
    parts: list[dict[str, Any]] = []
    if reasoning and context.include_thoughts:
        parts += [{"text": piece, "thought": True} for piece in _pieces(reasoning, stream)]
    parts += [{"text": piece} for piece in _pieces(result.content, stream)]
    parts += [{"functionCall": {"id": c.id, "name": c.name, "args": arguments_object(c)}} for c in result.tool_calls]
    if reasoning and parts:
        calls = [p for p in parts if "functionCall" in p]
        answer = [p for p in parts if not p.get("thought")]
        (calls or answer or parts)[0]["thoughtSignature"] = _signature(reasoning, sealer)
    return parts


def _pieces(text: str, stream: bool) -> list[str]:
    if not text:
        return []
    return pieces(text, _PIECE_CHARS) if stream else [text]


def chunks(request: ChatRequest, result: ChatResult, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One chunk per text piece, all function calls together, finishReason on the last chunk.

    A turn with no parts at all still ends with one chunk that carries the finishReason (Gemini
    CLI retries a stream that has none). polar does not invent text for an empty answer, so
    Gemini CLI will still report such a turn as NO_RESPONSE_TEXT and retry it.
    """
    groups = [[p] for p in parts if "functionCall" not in p]
    calls = [p for p in parts if "functionCall" in p]
    if calls or not groups:
        groups.append(calls)
    last = len(groups) - 1
    return [response(request, result, group, final=i == last) for i, group in enumerate(groups)]


def response(request: ChatRequest, result: ChatResult, parts: list[dict[str, Any]], final: bool) -> dict[str, Any]:
    content: dict[str, Any] = {"role": "model"}
    if parts:  # the real API leaves out `parts` rather than sending an empty list
        content["parts"] = parts
    candidate: dict[str, Any] = {"content": content}
    if final:
        candidate["finishReason"] = _FINISH[result.finish_reason]
    candidate["index"] = 0
    return {
        "candidates": [candidate],
        "usageMetadata": _usage(result, final),
        "modelVersion": request.model,
        "responseId": result.id,
    }


def _usage(result: ChatResult, final: bool) -> dict[str, Any]:
    """Cumulative usage. Output counts are known per turn, not per piece, so they arrive last."""
    u = result.usage
    usage: dict[str, Any] = {"promptTokenCount": u.prompt_tokens}
    if final:
        # Gemini counts thoughts apart from candidates; canonical completion tokens include them.
        usage["candidatesTokenCount"] = max(0, u.completion_tokens - u.reasoning_tokens)
    usage["totalTokenCount"] = u.total_tokens if final else u.prompt_tokens
    if u.cached_tokens:
        usage["cachedContentTokenCount"] = u.cached_tokens
    if final and u.reasoning_tokens:
        usage["thoughtsTokenCount"] = u.reasoning_tokens
    usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": u.prompt_tokens}]
    return usage


def envelope(route: Route, result: ChatResult, response: dict[str, Any]) -> dict[str, Any]:
    if getattr(route, "code_assist", False):
        return {"response": response, "traceId": result.id}
    return response


def _signature(reasoning_text: str, sealer: Sealer) -> str:
    """Base64 of the sealed reasoning: the Python SDK types `thoughtSignature` as bytes."""
    return base64.b64encode(sealer.seal(reasoning_text).encode()).decode()
