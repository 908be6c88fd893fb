"""Canonical result → Gemini `GenerateContentResponse`: the JSON answer, and what the live stream shares."""

from __future__ import annotations

import base64
from typing import Any

from polar.canonical import ChatRequest, ChatResult
from polar.errors import GatewayError
from polar.providers.base import arguments_object
from polar.providers.gemini.parse import GeminiContext
from polar.providers.reasoning_seal import Sealer

# Gemini ends a tool-calling turn with plain STOP; it has no tool-specific finish reason.
_FINISH = {
    "stop": "STOP",
    "tool_calls": "STOP",
    "stop_sequence": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
}

# kind → (HTTP code, google.rpc status). Google's code and status always travel as a pair.
ERRORS: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "INVALID_ARGUMENT"),
    "context_length": (400, "INVALID_ARGUMENT"),
    "too_large": (400, "INVALID_ARGUMENT"),  # Google answers oversized payloads with 400, not 413
    "authentication": (401, "UNAUTHENTICATED"),
    "permission": (403, "PERMISSION_DENIED"),
    "not_found": (404, "NOT_FOUND"),
    "rate_limit": (429, "RESOURCE_EXHAUSTED"),
    "upstream_error": (500, "INTERNAL"),
    "internal": (500, "INTERNAL"),
    "upstream_unavailable": (503, "UNAVAILABLE"),
    "upstream_timeout": (504, "DEADLINE_EXCEEDED"),
    "stopping": (503, "UNAVAILABLE"),
}


def answer_parts(context: GeminiContext, result: ChatResult, sealer: Sealer) -> list[dict[str, Any]]:
    """Response parts in order: thoughts (when asked for), text, function calls.

    The sealed reasoning rides on the answer text part and on the first function call: the parts a
    client keeps in its history (Gemini CLI merges consecutive text parts into the first one, dropping
    later parts' other fields, and wants a signature on the first call of a turn). A live stream
    signs the same parts, so both shapes agree.
    """
    reasoning = result.reasoning.text if result.reasoning else ""
    parts: list[dict[str, Any]] = []
    if reasoning and context.include_thoughts:
        parts.append({"text": reasoning, "thought": True})
    if result.content:
        parts.append({"text": result.content})
    parts += [{"functionCall": {"id": c.id, "name": c.name, "args": arguments_object(c)}} for c in result.tool_calls]
    if reasoning:
        answer = [p for p in parts if not p.get("thought")]
        first_call = next((p for p in answer if "functionCall" in p), None)
        for part in {id(p): p for p in answer[:1] + ([first_call] if first_call else [])}.values():
            part["thoughtSignature"] = signature(reasoning, sealer)
        if not answer:  # reasoning alone: a thought part (or none) carries it
            (parts or [{}])[0]["thoughtSignature"] = signature(reasoning, sealer)
    return parts


def response(request: ChatRequest, result: ChatResult, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole answer as one GenerateContentResponse."""
    content: dict[str, Any] = {"role": "model"}
    if parts:  # the real API leaves out `parts` rather than sending an empty list
        content["parts"] = parts
    candidate: dict[str, Any] = {"content": content, "finishReason": finish_reason(result), "index": 0}
    return {
        "candidates": [candidate],
        "usageMetadata": chunk_usage(result),
        "modelVersion": request.model,
        "responseId": result.id,
    }


def finish_reason(result: ChatResult) -> str:
    return _FINISH[result.finish_reason]


def chunk_usage(result: ChatResult) -> dict[str, Any]:
    """The final usage. Output counts are known per turn, not per piece, so a stream sends them last."""
    u = result.usage
    usage: dict[str, Any] = {"promptTokenCount": u.prompt_tokens}
    # Gemini counts thoughts apart from candidates; canonical completion tokens include them.
    usage["candidatesTokenCount"] = max(0, u.completion_tokens - u.reasoning_tokens)
    usage["totalTokenCount"] = u.total_tokens
    if u.cached_tokens:
        usage["cachedContentTokenCount"] = u.cached_tokens
    if u.reasoning_tokens:
        usage["thoughtsTokenCount"] = u.reasoning_tokens
    usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": u.prompt_tokens}]
    return usage


def envelope_of(code_assist: bool, trace_id: str, response: dict[str, Any]) -> dict[str, Any]:
    """Gemini CLI's Code Assist path wraps every answer and chunk."""
    return {"response": response, "traceId": trace_id} if code_assist else response


def error_object(error: GatewayError, status: int) -> dict[str, Any]:
    """The `error` member of an error answer or an in-stream error chunk."""
    rpc_status = ERRORS.get(error.kind, (500, "INTERNAL"))[1]
    message = error.message
    if error.kind == "context_length" and "input token count" not in message:
        message = f"The input token count exceeds the maximum number of tokens allowed. {message}"
    # Google's code always equals the HTTP status it travels with.
    body: dict[str, Any] = {"code": status, "message": message, "status": rpc_status}
    if error.param and rpc_status == "INVALID_ARGUMENT":
        body["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": error.param, "description": message}],
            }
        ]
    return body


def signature(reasoning_text: str, sealer: Sealer) -> str:
    """Base64 of the sealed reasoning: the Python SDK types `thoughtSignature` as bytes."""
    return base64.b64encode(sealer.seal(reasoning_text).encode()).decode()
