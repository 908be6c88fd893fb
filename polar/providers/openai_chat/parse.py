"""Chat Completions request body → canonical request (see the package docstring for the decisions)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from polar.canonical import (
    ChatRequest,
    Message,
    Part,
    Reasoning,
    Sampling,
    TextPart,
    Thinking,
    Tool,
    ToolCall,
)
from polar.providers.base import Parsed
from polar.providers.fields import (
    body_object,
    expect,
    invalid,
    number,
    optional,
    require,
)
from polar.providers.history import History, MessageReader, read_history, read_part
from polar.providers.openai_common import (
    image_from_url,
    json_schema_format,
    thinking_from_effort,
    tool_choice,
)


@dataclass(frozen=True)
class ChatContext:
    include_usage: bool = False  # stream_options.include_usage: a last chunk carries the usage


def parse_request(body: Any, history: History | None = None) -> Parsed[ChatContext]:
    """`history`: the session's earlier reads of its messages, resumed where this request repeats them."""
    body = body_object(body)
    _refuse_unsupported(body)
    raw_messages = require(body, "messages", list)
    if not raw_messages:
        raise invalid("'messages' must contain at least one message", "messages")
    stream_options = optional(body, "stream_options", dict, default={})
    include_usage = bool(optional(stream_options, "include_usage", bool, "stream_options."))
    template_kwargs = optional(body, "chat_template_kwargs", dict, default={})
    ignored = sorted(k for k in template_kwargs if k != "enable_thinking")
    rewrites = [f"chat_template_kwargs ignored: {', '.join(ignored)}"] if ignored else []
    response_format = optional(body, "response_format", dict)
    schema = (
        json_schema_format(response_format, "response_format", nested="json_schema") if response_format else None
    )
    messages = read_history(raw_messages, _Conversation(), history)
    request = ChatRequest(
        model=require(body, "model", str),
        messages=messages,
        tools=read_part(history, "tools", raw_tools := optional(body, "tools", list, default=[]),
                        lambda: tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(raw_tools))),
        tool_choice=tool_choice(body.get("tool_choice")),
        parallel_tool_calls=optional(body, "parallel_tool_calls", bool),
        sampling=_sampling(body),
        thinking=_thinking(body, template_kwargs),
        stream=optional(body, "stream", bool, default=False),
        response_schema=schema,
    )
    return Parsed(request, ChatContext(include_usage=include_usage), rewrites)


def _refuse_unsupported(body: dict) -> None:
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise invalid(f"'{legacy}' is the deprecated function-calling API; use 'tools' and 'tool_choice'", legacy)
    n = optional(body, "n", int)
    if n is not None and n != 1:
        raise invalid("only n=1 is supported", "n")


def _sampling(body: dict) -> Sampling:
    max_tokens = optional(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = optional(body, "max_tokens", int)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    elif stop is None:
        stop = []
    elif not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("'stop' must be a string or an array of strings", "stop")
    return Sampling(
        max_tokens=max_tokens,
        temperature=number(body, "temperature"),
        top_p=number(body, "top_p"),
        top_k=optional(body, "top_k", int),  # vLLM extension
        stop=stop,
        seed=optional(body, "seed", int),
        presence_penalty=number(body, "presence_penalty"),
        frequency_penalty=number(body, "frequency_penalty"),
    )


def _thinking(body: dict, template_kwargs: dict) -> Thinking:
    effort = body.get("reasoning_effort")
    thinking = Thinking() if effort is None else thinking_from_effort(effort, "reasoning_effort")
    # vLLM's switch for hybrid-thinking templates (Qwen3) wins over the effort level.
    enabled = optional(template_kwargs, "enable_thinking", bool, "chat_template_kwargs.")
    if enabled is not None:
        thinking.enabled = enabled
    return thinking


class _Conversation(MessageReader):
    """Reads `messages` one by one: each item is one complete message."""

    def read(self, index: int, item: Any) -> None:
        message = _message(item, f"messages[{index}]")
        if message.role == "tool":
            message.name = self.names.get(message.tool_call_id or "")
        self.names.add(message)
        self.messages.append(message)


def _message(raw: Any, where: str) -> Message:
    raw = expect(raw, dict, where)
    role = require(raw, "role", str, f"{where}.")
    if role in ("system", "developer"):
        return Message(role="system", content=_parts(raw.get("content"), f"{where}.content", images=False))
    if role == "user":
        return Message(role="user", content=_parts(raw.get("content"), f"{where}.content", images=True))
    if role == "assistant":
        return _assistant(raw, where)
    if role == "tool":
        return Message(
            role="tool",
            tool_call_id=require(raw, "tool_call_id", str, f"{where}."),
            content=_parts(raw.get("content"), f"{where}.content", images=True),
        )
    if role == "function":
        raise invalid(f"'{where}.role' 'function' is the deprecated function-calling API; use 'tool'", f"{where}.role")
    raise invalid(f"'{where}.role' must be system, developer, user, assistant or tool", f"{where}.role")


def _assistant(raw: dict, where: str) -> Message:
    content = _parts(raw.get("content"), f"{where}.content", images=False)
    refusal = optional(raw, "refusal", str, f"{where}.")
    if refusal and not content:
        content = [TextPart(text=refusal)]
    # Harnesses echo the thinking back under either name (see module docstring).
    reasoning_text = optional(raw, "reasoning_content", str, f"{where}.") or optional(
        raw, "reasoning", str, f"{where}."
    )
    calls = optional(raw, "tool_calls", list, f"{where}.", default=[])
    return Message(
        role="assistant",
        content=content,
        reasoning=[Reasoning(text=reasoning_text)] if reasoning_text else [],
        tool_calls=[_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)],
    )


def _tool_call(raw: Any, where: str) -> ToolCall:
    raw = expect(raw, dict, where)
    if raw.get("type", "function") != "function":
        raise invalid(f"'{where}.type' must be 'function'", f"{where}.type")
    function = expect(raw.get("function"), dict, f"{where}.function")
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # some replayed histories carry parsed arguments
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif arguments is None:
        arguments = "{}"
    return ToolCall(
        id=require(raw, "id", str, f"{where}."),
        name=require(function, "name", str, f"{where}.function."),
        arguments=expect(arguments, str, f"{where}.function.arguments"),
    )


def _parts(content: Any, where: str, *, images: bool) -> list[Part]:
    """Message content: null, a string, or an array of content parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(text=content)] if content else []
    return [_part(p, f"{where}[{i}]", images) for i, p in enumerate(expect(content, list, where))]


def _part(raw: Any, where: str, images: bool) -> Part:
    raw = expect(raw, dict, where)
    kind = raw.get("type")
    if kind == "text":
        return TextPart(text=require(raw, "text", str, f"{where}."))
    if kind == "refusal":
        return TextPart(text=require(raw, "refusal", str, f"{where}."))
    if kind == "image_url" and images:
        image = raw.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        return image_from_url(url, f"{where}.image_url.url")
    raise invalid(f"'{where}.type' {kind!r} is not a supported content part here", f"{where}.type")


def _tool(raw: Any, where: str) -> Tool:
    raw = expect(raw, dict, where)
    if raw.get("type") != "function":
        raise invalid(f"'{where}.type' must be 'function' (custom tools are not supported here)", f"{where}.type")
    function = expect(raw.get("function"), dict, f"{where}.function")
    parameters = optional(function, "parameters", dict, f"{where}.function.")
    return Tool(
        name=require(function, "name", str, f"{where}.function."),
        description=optional(function, "description", str, f"{where}.function."),
        **({"parameters": parameters} if parameters is not None else {}),
    )


