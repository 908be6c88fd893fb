"""Canonical messages and tools in the OpenAI chat format: what vLLM's chat endpoint takes and what
chat templates render (polar's own prompt rendering and vLLM's see the same messages)."""

from __future__ import annotations

from typing import Any

from polar.canonical import ImagePart, Message, TextPart, Tool


def to_openai_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    """Canonical tools as OpenAI function tools (what vLLM's chat endpoint and templates take)."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.parameters}}
        for t in tools
    ]


def to_openai_messages(msg: Message) -> list[dict[str, Any]]:
    """One canonical message as OpenAI chat messages (the shape vLLM's chat template consumes)."""
    if msg.role == "tool":
        text = msg.text()
        if msg.is_error and not text.lower().startswith("error"):
            text = f"Error: {text}"
        return [{"role": "tool", "tool_call_id": msg.tool_call_id or "", "content": text}]
    if msg.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": msg.text()}
        reasoning = msg.reasoning_text()
        if reasoning:
            # Templates read `reasoning_content`; vLLM's /tokenize reads only `reasoning`.
            out["reasoning_content"] = out["reasoning"] = reasoning
        if msg.tool_calls:
            out["tool_calls"] = [
                {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments or "{}"}}
                for tc in msg.tool_calls
            ]
        return [out]
    if all(isinstance(p, TextPart) for p in msg.content):
        return [{"role": msg.role, "content": msg.text()}]
    parts: list[dict[str, Any]] = []
    for p in msg.content:
        if isinstance(p, TextPart):
            parts.append({"type": "text", "text": p.text})
        elif isinstance(p, ImagePart):
            url = p.url or f"data:{p.media_type or 'image/png'};base64,{p.data or ''}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return [{"role": msg.role, "content": parts}]
