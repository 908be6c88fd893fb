"""Canonical result → a Response object, or the SSE event sequence that streams one."""

from __future__ import annotations

from polar.canonical import ChatRequest, ChatResult, ToolCall
from polar.providers.base import now
from polar.providers.openai_common import deltas
from polar.providers.openai_responses.parse import ResponsesContext
from polar.providers.reasoning_seal import Sealer
from polar.providers.stream import sse_event

_ENCRYPTED = "reasoning.encrypted_content"


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
    item_status = _status(result)[0]
    items: list[dict] = []
    if result.reasoning and result.reasoning.text:
        items.append(_reasoning_item(context, result, sealer))
    if result.content or not result.tool_calls:
        text = {"type": "output_text", "text": result.content, "annotations": [], "logprobs": []}
        items.append(
            {"type": "message", "id": f"msg_{result.id}", "status": item_status, "role": "assistant", "content": [text]}
        )
    for i, call in enumerate(result.tool_calls):
        items.append(
            _custom_call_item(result, i, call)
            if call.name in context.custom_tools
            else _function_call_item(result, i, call, item_status)
        )
    return items


def _reasoning_item(context: ResponsesContext, result: ChatResult, sealer: Sealer) -> dict:
    text = result.reasoning.text
    # vLLM has no reasoning summaries: the full text serves as the summary and as the raw content.
    item = {
        "type": "reasoning",
        "id": f"rs_{result.id}",
        "summary": [{"type": "summary_text", "text": text}],
        "content": [{"type": "reasoning_text", "text": text}],
    }
    if _ENCRYPTED in context.include:
        item["encrypted_content"] = sealer.seal(text)
    return item


def _function_call_item(result: ChatResult, index: int, call: ToolCall, status: str) -> dict:
    return {
        "type": "function_call",
        "id": f"fc_{result.id}_{index}",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def _custom_call_item(result: ChatResult, index: int, call: ToolCall) -> dict:
    args = call.arguments_obj()
    # The model was shown an `input` string parameter; text that is not that object is the input itself.
    raw = args["input"] if isinstance(args, dict) and isinstance(args.get("input"), str) else call.arguments
    return {
        "type": "custom_tool_call",
        "id": f"ctc_{result.id}_{index}",
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
    context: ResponsesContext, request: ChatRequest, result: ChatResult, output: list[dict], *, final: bool = True
) -> dict:
    """The Response object: finished (`final`) or as first announced on a stream."""
    echo = context.echo
    status, incomplete = _status(result) if final else ("in_progress", None)
    return {
        "id": f"resp_{result.id}",
        "object": "response",
        "created_at": result.created,
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


def stream(context: ResponsesContext, request: ChatRequest, result: ChatResult, sealer: Sealer) -> bytes:
    output = output_items(context, request, result, sealer)
    opened = response_object(context, request, result, [], final=False)
    events: list[dict] = [
        {"type": "response.created", "response": opened},
        {"type": "response.in_progress", "response": opened},
    ]
    for index, item in enumerate(output):
        events += _item_events(index, item)
    final = response_object(context, request, result, output)
    # A length cut still ends with `response.completed` (its response says status "incomplete" and
    # why): Codex and the SDK's stream helper accept no other terminal event, and would otherwise
    # treat a truncated turn as a dropped stream and retry it.
    events.append({"type": "response.completed", "response": final})
    return b"".join(
        sse_event({"type": e["type"], "sequence_number": n, **e}, event=e["type"]) for n, e in enumerate(events)
    )


def _item_events(index: int, item: dict) -> list[dict]:
    """output_item.added, the item's own delta events, output_item.done."""
    at = {"item_id": item["id"], "output_index": index}
    kind = item["type"]
    if kind == "reasoning":
        opened, body = {"type": "reasoning", "id": item["id"], "summary": []}, _reasoning_events(at, item)
    elif kind == "message":
        opened, body = {**item, "status": "in_progress", "content": []}, _message_events(at, item)
    elif kind == "function_call":
        opened = {**item, "arguments": "", "status": "in_progress"}
        body = [{"type": "response.function_call_arguments.delta", **at, "delta": p} for p in deltas(item["arguments"])]
        body.append(
            {
                "type": "response.function_call_arguments.done",
                **at,
                "name": item["name"],
                "arguments": item["arguments"],
            }
        )
    else:  # custom_tool_call
        opened = {**item, "input": ""}
        body = [{"type": "response.custom_tool_call_input.delta", **at, "delta": p} for p in deltas(item["input"])]
        body.append({"type": "response.custom_tool_call_input.done", **at, "input": item["input"]})
    return [
        {"type": "response.output_item.added", "output_index": index, "item": opened},
        *body,
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def _message_events(at: dict, item: dict) -> list[dict]:
    events: list[dict] = []
    for ci, part in enumerate(item["content"]):
        here = {**at, "content_index": ci}
        events.append({"type": "response.content_part.added", **here, "part": {**part, "text": ""}})
        events += [
            {"type": "response.output_text.delta", **here, "delta": p, "logprobs": []} for p in deltas(part["text"])
        ]
        events.append({"type": "response.output_text.done", **here, "text": part["text"], "logprobs": []})
        events.append({"type": "response.content_part.done", **here, "part": part})
    return events


def _reasoning_events(at: dict, item: dict) -> list[dict]:
    events: list[dict] = []
    for si, part in enumerate(item["summary"]):
        here = {**at, "summary_index": si}
        events.append({"type": "response.reasoning_summary_part.added", **here, "part": {**part, "text": ""}})
        events += [{"type": "response.reasoning_summary_text.delta", **here, "delta": p} for p in deltas(part["text"])]
        events.append({"type": "response.reasoning_summary_text.done", **here, "text": part["text"]})
        events.append({"type": "response.reasoning_summary_part.done", **here, "part": part})
    for ci, part in enumerate(item["content"]):
        here = {**at, "content_index": ci}
        events.append({"type": "response.content_part.added", **here, "part": {**part, "text": ""}})
        events += [{"type": "response.reasoning_text.delta", **here, "delta": p} for p in deltas(part["text"])]
        events.append({"type": "response.reasoning_text.done", **here, "text": part["text"]})
        events.append({"type": "response.content_part.done", **here, "part": part})
    return events
