"""Canonical result → a Response object and its output items (the live stream, stream.py, shares them)."""

from __future__ import annotations

from polar.canonical import ChatRequest, ChatResult, ToolCall
from polar.providers.base import now
from polar.providers.openai_responses.parse import ResponsesContext
from polar.providers.reasoning_seal import Sealer

_ENCRYPTED = "reasoning.encrypted_content"


def item_status(result: ChatResult) -> str:
    return _status(result)[0]


def _status(result: ChatResult) -> tuple[str, dict | None]:
    if result.finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if result.finish_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _usage(result: ChatResult) -> dict:
    u = result.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def output_items(context: ResponsesContext, request: ChatRequest, result: ChatResult, sealer: Sealer) -> list[dict]:
    """The finished output items, in the order the model produced them."""
    status = item_status(result)
    items: list[dict] = []
    if result.reasoning and result.reasoning.text:
        items.append(reasoning_item(context, result.id, result.reasoning.text, sealer))
    if result.content or not result.tool_calls:
        text = {"type": "output_text", "text": result.content, "annotations": [], "logprobs": []}
        items.append(
            {"type": "message", "id": f"msg_{result.id}", "status": status, "role": "assistant", "content": [text]}
        )
    for call in result.tool_calls:
        index = len(items)
        items.append(
            custom_call_item(result.id, index, call)
            if call.name in context.custom_tools
            else function_call_item(result.id, index, call, status)
        )
    return items


def reasoning_item(context: ResponsesContext, call_id: str, text: str, sealer: Sealer) -> dict:
    # vLLM has no reasoning summaries: the full text serves as the summary and as the raw content.
    item = {
        "type": "reasoning",
        "id": f"rs_{call_id}",
        "summary": [{"type": "summary_text", "text": text}],
        "content": [{"type": "reasoning_text", "text": text}],
    }
    if _ENCRYPTED in context.include:
        item["encrypted_content"] = sealer.seal(text)
    return item


def function_call_item(call_id: str, index: int, call: ToolCall, status: str) -> dict:
    """A function call, numbered by its position among the output items."""
    return {
        "type": "function_call",
        "id": f"fc_{call_id}_{index}",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def custom_call_item(call_id: str, index: int, call: ToolCall) -> dict:
    args = call.arguments_obj()
    # The model was shown an `input` string parameter; text that is not that object is the input itself.
    raw = args["input"] if isinstance(args, dict) and isinstance(args.get("input"), str) else call.arguments
    return {
        "type": "custom_tool_call",
        "id": f"ctc_{call_id}_{index}",
        "call_id": call.id,
        "name": call.name,
        "input": raw,
    }


def _echoed_tools(context: ResponsesContext, request: ChatRequest) -> list[dict]:
    return [
        {"type": "custom", "name": t.name, "description": t.description}
        if t.name in context.custom_tools
        else {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": False,
        }
        for t in request.tools
    ]


def response_object(
    context: ResponsesContext, request: ChatRequest, call_id: str, result: ChatResult | None, output: list[dict]
) -> dict:
    """The Response object: finished (with its `result`) or, without one, as a stream announces it."""
    echo = context.echo
    final = result is not None
    status, incomplete = _status(result) if final else ("in_progress", None)
    return {
        "id": f"resp_{call_id}",
        "object": "response",
        "created_at": result.created if final else now(),
        "status": status,
        "background": False,
        "completed_at": now() if status == "completed" else None,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": echo.get("previous_response_id"),
        "prompt_cache_key": echo.get("prompt_cache_key"),
        "reasoning": echo.get("reasoning", {"effort": None, "summary": None}),
        "service_tier": echo.get("service_tier", "default"),
        "store": echo.get("store", True),
        "temperature": request.sampling.temperature,
        "text": echo.get("text", {"format": {"type": "text"}}),
        "tool_choice": echo.get("tool_choice", "auto"),
        "tools": _echoed_tools(context, request),
        "top_logprobs": echo.get("top_logprobs", 0),
        "top_p": request.sampling.top_p,
        "truncation": echo.get("truncation", "disabled"),
        "usage": _usage(result) if final else None,
        "user": None,
        "metadata": echo.get("metadata", {}),
    }
