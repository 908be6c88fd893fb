"""Responses request → canonical request: settings, tools, and input items folded into messages."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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
from polar.providers.base import Parsed, Route
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
from polar.providers.reasoning_seal import Sealer

_SERVER_STATE = ("conversation", "prompt")
# Request settings a Response object repeats back verbatim, with the type each must have.
_ECHOED: dict[str, type | tuple[type, ...]] = {
    "instructions": str,
    "max_output_tokens": int,
    "metadata": dict,
    "previous_response_id": str,
    "prompt_cache_key": str,
    "reasoning": dict,
    "service_tier": str,
    "store": bool,
    "text": dict,
    "tool_choice": (str, dict),
    "top_logprobs": int,
    "truncation": str,
}


@dataclass(frozen=True)
class ResponsesContext:
    """What the Response object needs beyond the canonical request."""

    echo: dict[str, Any] = field(default_factory=dict)  # request settings repeated back verbatim
    include: tuple[str, ...] = ()  # e.g. "reasoning.encrypted_content"
    custom_tools: frozenset[str] = frozenset()  # tools answered as custom_tool_call items


def parse_request(route: Route, body: Any, sealer: Sealer, history: History | None = None) -> Parsed[ResponsesContext]:
    """`history`: the session's earlier reads of its input items, resumed where this request repeats them."""
    body = body_object(body)
    _refuse_server_state(body)
    counting = route.endpoint == "count_tokens"
    echo = {key: optional(body, key, typ) for key, typ in _ECHOED.items() if body.get(key) is not None}
    previous = optional(body, "previous_response_id", str)
    include = tuple(expect(x, str, f"include[{i}]") for i, x in enumerate(optional(body, "include", list, default=[])))
    raw_tools = optional(body, "tools", list, default=[])
    tools, custom, ignored_tools = read_part(history, "tools", raw_tools, lambda: _tools(raw_tools))
    messages, skipped = _history(body, sealer, history, required=not (counting or previous))
    fmt = optional(body, "text", dict, default={}).get("format")
    request = ChatRequest(
        # The count endpoint may omit the model; the gateway then uses its default.
        model=optional(body, "model", str, default="") if counting else require(body, "model", str),
        messages=messages,
        tools=tools,
        tool_choice=tool_choice(body.get("tool_choice")),
        parallel_tool_calls=optional(body, "parallel_tool_calls", bool),
        sampling=Sampling(
            max_tokens=optional(body, "max_output_tokens", int),
            temperature=number(body, "temperature"),
            top_p=number(body, "top_p"),
        ),
        thinking=_thinking(optional(body, "reasoning", dict, default={})),
        stream=False if counting else optional(body, "stream", bool, default=False),
        response_schema=None if fmt is None else json_schema_format(fmt, "text.format"),
        continues=previous or None,
        metadata=echo.get("metadata", {}),
    )
    rewrites = [f"hosted tool not offered to the model: {kind}" for kind in ignored_tools]
    rewrites += [f"input item skipped: {kind}" for kind in skipped]
    context = ResponsesContext(echo=echo, include=include, custom_tools=frozenset(custom))
    return Parsed(request, context, rewrites)


# ---------------------------------------------------------------------------------------------
# settings and tools


def _refuse_server_state(body: dict) -> None:
    for key in _SERVER_STATE:
        if body.get(key) is not None:
            raise invalid(f"'{key}' needs server-side state polar does not keep; send the full 'input'", key)
    if body.get("background"):
        raise invalid("background responses are not supported; use stream or a plain request", "background")


def _thinking(reasoning: dict) -> Thinking:
    effort = reasoning.get("effort")
    return Thinking() if effort is None else thinking_from_effort(effort, "reasoning.effort")


def _tools(raw_tools: list) -> tuple[tuple[Tool, ...], tuple[str, ...], tuple[str, ...]]:
    """Function and custom tools for the model; names of the custom ones; types left out."""
    tools: list[Tool] = []
    custom: list[str] = []
    ignored: list[str] = []
    for i, raw in enumerate(raw_tools):
        where = f"tools[{i}]"
        raw = expect(raw, dict, where)
        kind = expect(raw.get("type"), str, f"{where}.type")
        if kind == "function":
            tools.append(_function_tool(raw, where))
        elif kind == "custom":
            tools.append(_custom_tool(raw, where))
            custom.append(tools[-1].name)
        elif kind not in ignored:
            ignored.append(kind)
    return tuple(tools), tuple(custom), tuple(ignored)


def _function_tool(raw: dict, where: str) -> Tool:
    parameters = optional(raw, "parameters", dict, f"{where}.")
    return Tool(
        name=require(raw, "name", str, f"{where}."),
        description=optional(raw, "description", str, f"{where}."),
        **({"parameters": parameters} if parameters is not None else {}),
    )


def _custom_tool(raw: dict, where: str) -> Tool:
    fmt = optional(raw, "format", dict, f"{where}.", default={})
    about = "The raw input text for this tool (not JSON)."
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        about += f" It must follow this {fmt.get('syntax', '')} grammar:\n{fmt['definition']}"
    return Tool(
        name=require(raw, "name", str, f"{where}."),
        description=optional(raw, "description", str, f"{where}."),
        parameters={
            "type": "object",
            "properties": {"input": {"type": "string", "description": about}},
            "required": ["input"],
        },
    )


# ---------------------------------------------------------------------------------------------
# input items → canonical messages


def _history(body: dict, sealer: Sealer, history: History | None, *, required: bool) -> tuple[list[Message], list[str]]:
    """The instructions and input items as messages, and the item types skipped."""
    messages: list[Message] = []
    instructions = optional(body, "instructions", str)
    if instructions:  # the same object while the session sends the same instructions (memos: once)
        messages += read_part(history, "instructions", instructions,
                              lambda: [Message(role="system", content=[TextPart(text=instructions)])])
    raw_input = body.get("input")
    items = _Items(sealer)
    if raw_input is None:
        if required:
            raise invalid("missing required field 'input'", "input")
    elif isinstance(raw_input, str):
        messages.append(Message(role="user", content=[TextPart(text=raw_input)]))
    else:
        messages += read_history(expect(raw_input, list, "input"), items, history)
    return messages, items.notes


class _Items(MessageReader):
    """Folds Responses input items into canonical messages, merging each assistant turn (settled whenever no
    assistant turn is open for more items). Its notes are the item types skipped."""

    def __init__(self, sealer: Sealer) -> None:
        super().__init__()
        self.sealer = sealer
        self._turn: Message | None = None  # the assistant message still open for more items
        self._call_ids: dict[str, str] = {}  # local_shell item id -> call id

    def checkpoint(self) -> tuple | None:
        return None if self._turn is not None else tuple(self._call_ids.items())

    def resume(self, messages: list[Message], notes: list[str], state: tuple) -> None:
        super().resume(messages, notes, state)
        self._call_ids = dict(state)

    def add(self, message: Message) -> None:
        self.messages.append(message)
        self._turn = None

    def assistant(self, *, fresh_if: bool) -> Message:
        """The open assistant message, or a new one when there is none or `fresh_if` holds."""
        if self._turn is None or fresh_if:
            self.add(Message(role="assistant"))
            self._turn = self.messages[-1]
        return self._turn

    def read(self, index: int, item: Any) -> None:
        where = f"input[{index}]"
        item = expect(item, dict, where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, where)
        elif kind == "reasoning":
            reasoning = _reasoning(item, where, self.sealer)
            if reasoning is not None:
                turn = self.assistant(fresh_if=bool(self._turn and (self._turn.content or self._turn.tool_calls)))
                turn.reasoning.append(reasoning)
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            call = self._call(kind, item, where)
            self.assistant(fresh_if=False).tool_calls.append(call)
            self.names[call.id] = call.name
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            self.add(self._output(kind, item, where))
        elif kind == "item_reference":
            raise invalid(f"'{where}' is an item_reference, which needs stored items polar does not keep", where)
        elif isinstance(kind, str):
            if kind not in self.notes:
                self.notes.append(kind)
        else:
            raise invalid(f"'{where}.type' must be a string", f"{where}.type")

    def _message(self, item: dict, where: str) -> None:
        role = require(item, "role", str, f"{where}.")
        content = _content(item.get("content"), f"{where}.content")
        if role == "assistant":
            turn = self.assistant(fresh_if=bool(self._turn and self._turn.tool_calls))
            turn.content.extend(content)
        elif role in ("system", "developer"):
            self.add(Message(role="system", content=content))
        elif role == "user":
            self.add(Message(role="user", content=content))
        else:
            raise invalid(f"'{where}.role' must be user, system, developer or assistant", f"{where}.role")

    def _call(self, kind: str, item: dict, where: str) -> ToolCall:
        if kind == "function_call":
            return ToolCall(
                id=require(item, "call_id", str, f"{where}."),
                name=require(item, "name", str, f"{where}."),
                arguments=require(item, "arguments", str, f"{where}."),
            )
        if kind == "custom_tool_call":
            raw_input = require(item, "input", str, f"{where}.")
            return ToolCall(
                id=require(item, "call_id", str, f"{where}."),
                name=require(item, "name", str, f"{where}."),
                arguments=json.dumps({"input": raw_input}, ensure_ascii=False),
            )
        action = require(item, "action", dict, f"{where}.")
        call_id = optional(item, "call_id", str, f"{where}.") or require(item, "id", str, f"{where}.")
        if isinstance(item.get("id"), str):
            self._call_ids[item["id"]] = call_id
        return ToolCall(id=call_id, name="local_shell", arguments=json.dumps(action, ensure_ascii=False))

    def _output(self, kind: str, item: dict, where: str) -> Message:
        if kind == "local_shell_call_output":
            item_id = require(item, "id", str, f"{where}.")
            call_id = self._call_ids.get(item_id, item_id)
        else:
            call_id = require(item, "call_id", str, f"{where}.")
        output = item.get("output")
        if output is None:
            raise invalid(f"missing required field '{where}.output'", f"{where}.output")
        return Message(role="tool", tool_call_id=call_id, name=self.names.get(call_id),
                       content=_content(output, f"{where}.output"))


def _content(content: Any, where: str) -> list[Part]:
    """Message or tool-output content: a string or an array of input/output parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(text=content)] if content else []
    return [_part(expect(p, dict, f"{where}[{i}]"), f"{where}[{i}]") for i, p in enumerate(expect(content, list, where))]


def _part(raw: dict, where: str) -> Part:
    kind = raw.get("type")
    if kind in ("input_text", "output_text", "text"):
        return TextPart(text=require(raw, "text", str, f"{where}."))
    if kind == "refusal":
        return TextPart(text=require(raw, "refusal", str, f"{where}."))
    if kind == "input_image":
        if raw.get("image_url") is None:
            raise invalid(f"missing '{where}.image_url' (uploaded file ids are not supported)", f"{where}.image_url")
        return image_from_url(raw["image_url"], f"{where}.image_url")
    raise invalid(f"'{where}.type' {kind!r} is not a supported content part here", f"{where}.type")


def _texts(parts: Any, where: str, kinds: tuple[str, ...]) -> list[str]:
    texts = []
    for i, part in enumerate(expect(parts, list, where) if parts is not None else []):
        part = expect(part, dict, f"{where}[{i}]")
        if part.get("type") in kinds:
            texts.append(require(part, "text", str, f"{where}[{i}]."))
    return texts


def _reasoning(item: dict, where: str, sealer: Sealer) -> Reasoning | None:
    blob = optional(item, "encrypted_content", str, f"{where}.")
    raw = "".join(_texts(item.get("content"), f"{where}.content", ("reasoning_text", "text")))
    summary = "\n\n".join(_texts(item.get("summary"), f"{where}.summary", ("summary_text",)))
    text = sealer.unseal(blob) or raw or summary
    if text:
        return Reasoning(text=text, signature=blob)
    return Reasoning(text=blob, redacted=True) if blob else None
