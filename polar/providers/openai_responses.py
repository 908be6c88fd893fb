"""OpenAI Responses: `POST …/responses` ⇄ canonical request and result.

Routing: any POST whose path ends in `/responses` (OpenAI `/v1/responses`, a proxy-stripped
`/responses`, ChatGPT's `/backend-api/codex/responses` that Codex uses when logged in, Azure and
other prefixed hosts), and `…/responses/input_tokens` as the token-count endpoint.

How items become canonical messages:
- `instructions` is the first system message; system and developer items are system messages.
- One assistant turn arrives as several items (reasoning, message, function_call…). Consecutive
  assistant-side items merge into ONE assistant message, the shape chat templates expect. A new
  assistant message starts only where order would otherwise be lost: reasoning after content or
  calls, or text after calls.
- Reasoning text is recovered from `encrypted_content` when polar sealed it (Codex echoes only the
  blob and an empty summary), else from `content` reasoning_text, else from the summary. The blob
  is kept as `Reasoning.signature` so it round-trips; a blob polar cannot read (made by OpenAI)
  with no readable text becomes a redacted reasoning block.
- Custom (freeform) tools, such as Codex's `apply_patch`, become a canonical tool with a single
  string parameter `input` (the grammar, if any, is given in its description). Their calls travel
  canonically as arguments `{"input": <raw text>}` and are rendered back as `custom_tool_call`
  items carrying the raw text.
- `local_shell_call` history items become calls of a tool named `local_shell` whose arguments
  are the action object; hosted tools (web search, MCP, computer…) are not offered to the model
  and their items are skipped. Skipped tool and item types are listed in
  `metadata["ignored_tools"]` / `metadata["ignored_items"]`, so nothing disappears unseen.
- Server-side state polar does not keep (`conversation`, `background`, stored `prompt`s,
  `item_reference`) is refused with a clear message. `previous_response_id` is handed to the
  gateway in `metadata["previous_response_id"]`: captures are polar's store.

Metadata keys set by `parse`: `include`, `previous_response_id`, `custom_tools`, `echo` (the
request settings a Response object repeats back), `ignored_tools`, `ignored_items`.
"""

from __future__ import annotations

import json
from typing import Any

from polar.canonical import (
    ChatRequest,
    ChatResult,
    Message,
    Part,
    Reasoning,
    Sampling,
    TextPart,
    Thinking,
    Tool,
    ToolCall,
)
from polar.errors import GatewayError, invalid, optional, require
from polar.providers.base import HttpReply, Provider, Route, now, sse_event
from polar.providers.openai_common import (
    array,
    bare_path,
    error_reply,
    image_from_url,
    json_schema_format,
    models_reply,
    name_tool_results,
    number,
    obj,
    pieces,
    string,
    thinking_from_effort,
    tool_choice,
)
from polar.providers.reasoning_seal import seal, unseal

_ENCRYPTED = "reasoning.encrypted_content"
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


class OpenAIResponses(Provider):
    name = "openai_responses"

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        if method.upper() != "POST":
            return None
        path = bare_path(path)
        if path.endswith("/responses"):
            return Route(self, "generate")
        if path.endswith("/responses/input_tokens"):
            return Route(self, "count_tokens")
        return None

    def parse(self, route: Route, body: Any) -> ChatRequest:
        body = obj(body, "request body")
        _refuse_server_state(body)
        counting = route.endpoint == "count_tokens"
        echo = {key: optional(body, key, typ) for key, typ in _ECHOED.items() if body.get(key) is not None}
        metadata: dict[str, Any] = {"echo": echo}
        previous = optional(body, "previous_response_id", str)
        if previous:
            metadata["previous_response_id"] = previous
        include = optional(body, "include", list, default=[])
        if include:
            metadata["include"] = [string(x, f"include[{i}]") for i, x in enumerate(include)]
        tools, custom, ignored_tools = _tools(optional(body, "tools", list, default=[]))
        if custom:
            metadata["custom_tools"] = custom
        if ignored_tools:
            metadata["ignored_tools"] = ignored_tools
        messages = _history(body, required=not (counting or previous), metadata=metadata)
        fmt = optional(body, "text", dict, default={}).get("format")
        return ChatRequest(
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
            metadata=metadata,
        )

    def render(self, route: Route, request: ChatRequest, result: ChatResult) -> HttpReply:
        if request.stream:
            return HttpReply.sse(_stream(request, result))
        return HttpReply.json(_response(request, result, _output(request, result)))

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        return HttpReply.json({"object": "response.input_tokens", "input_tokens": input_tokens})

    def render_error(self, error: GatewayError) -> HttpReply:
        return error_reply(error)

    def render_models(self, models: list[str]) -> HttpReply:
        return models_reply(models)


# ---------------------------------------------------------------------------------------------
# request: settings and tools


def _refuse_server_state(body: dict) -> None:
    for key in _SERVER_STATE:
        if body.get(key) is not None:
            raise invalid(f"'{key}' needs server-side state polar does not keep; send the full 'input'", key)
    if body.get("background"):
        raise invalid("background responses are not supported; use stream or a plain request", "background")


def _thinking(reasoning: dict) -> Thinking:
    effort = reasoning.get("effort")
    return Thinking() if effort is None else thinking_from_effort(effort, "reasoning.effort")


def _tools(raw_tools: list) -> tuple[list[Tool], list[str], list[str]]:
    """Function and custom tools for the model; names of the custom ones; types left out."""
    tools: list[Tool] = []
    custom: list[str] = []
    ignored: list[str] = []
    for i, raw in enumerate(raw_tools):
        where = f"tools[{i}]"
        raw = obj(raw, where)
        kind = string(raw.get("type"), f"{where}.type")
        if kind == "function":
            tools.append(_function_tool(raw, where))
        elif kind == "custom":
            tools.append(_custom_tool(raw, where))
            custom.append(tools[-1].name)
        elif kind not in ignored:
            ignored.append(kind)
    return tools, custom, ignored


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
# request: input items → canonical messages


def _history(body: dict, *, required: bool, metadata: dict) -> list[Message]:
    history = _History()
    instructions = optional(body, "instructions", str)
    if instructions:
        history.add(Message(role="system", content=[TextPart(text=instructions)]))
    raw_input = body.get("input")
    if raw_input is None:
        if required:
            raise invalid("missing required field 'input'", "input")
    elif isinstance(raw_input, str):
        history.add(Message(role="user", content=[TextPart(text=raw_input)]))
    else:
        for i, item in enumerate(array(raw_input, "input")):
            history.item(obj(item, f"input[{i}]"), f"input[{i}]")
    if history.ignored:
        metadata["ignored_items"] = history.ignored
    name_tool_results(history.messages)
    return history.messages


class _History:
    """Folds Responses input items into canonical messages, merging each assistant turn."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.ignored: list[str] = []
        self._turn: Message | None = None  # the assistant message still open for more items
        self._call_ids: dict[str, str] = {}  # local_shell item id -> call id

    def add(self, message: Message) -> None:
        self.messages.append(message)
        self._turn = None

    def assistant(self, *, fresh_if: bool) -> Message:
        """The open assistant message, or a new one when there is none or `fresh_if` holds."""
        if self._turn is None or fresh_if:
            self.add(Message(role="assistant"))
            self._turn = self.messages[-1]
        return self._turn

    def item(self, item: dict, where: str) -> None:
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, where)
        elif kind == "reasoning":
            reasoning = _reasoning(item, where)
            if reasoning is not None:
                turn = self.assistant(fresh_if=bool(self._turn and (self._turn.content or self._turn.tool_calls)))
                turn.reasoning.append(reasoning)
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            self.assistant(fresh_if=False).tool_calls.append(self._call(kind, item, where))
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            self.add(self._output(kind, item, where))
        elif kind == "item_reference":
            raise invalid(f"'{where}' is an item_reference, which needs stored items polar does not keep", where)
        elif isinstance(kind, str):
            if kind not in self.ignored:
                self.ignored.append(kind)
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
        return Message(role="tool", tool_call_id=call_id, content=_content(output, f"{where}.output"))


def _content(content: Any, where: str) -> list[Part]:
    """Message or tool-output content: a string or an array of input/output parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(text=content)] if content else []
    return [_part(obj(p, f"{where}[{i}]"), f"{where}[{i}]") for i, p in enumerate(array(content, where))]


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
    for i, part in enumerate(array(parts, where) if parts is not None else []):
        part = obj(part, f"{where}[{i}]")
        if part.get("type") in kinds:
            texts.append(require(part, "text", str, f"{where}[{i}]."))
    return texts


def _reasoning(item: dict, where: str) -> Reasoning | None:
    blob = optional(item, "encrypted_content", str, f"{where}.")
    raw = "".join(_texts(item.get("content"), f"{where}.content", ("reasoning_text", "text")))
    summary = "\n\n".join(_texts(item.get("summary"), f"{where}.summary", ("summary_text",)))
    text = unseal(blob) or raw or summary
    if text:
        return Reasoning(text=text, signature=blob)
    return Reasoning(text=blob, redacted=True) if blob else None


# ---------------------------------------------------------------------------------------------
# response


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


def _output(request: ChatRequest, result: ChatResult) -> list[dict]:
    """The finished output items, in the order the model produced them."""
    item_status = _status(result)[0]
    items: list[dict] = []
    if result.reasoning and result.reasoning.text:
        items.append(_reasoning_item(request, result))
    if result.content or not result.tool_calls:
        text = {"type": "output_text", "text": result.content, "annotations": [], "logprobs": []}
        items.append(
            {"type": "message", "id": f"msg_{result.id}", "status": item_status, "role": "assistant", "content": [text]}
        )
    custom = set(request.metadata.get("custom_tools", []))
    for i, call in enumerate(result.tool_calls):
        items.append(
            _custom_call_item(result, i, call)
            if call.name in custom
            else _function_call_item(result, i, call, item_status)
        )
    return items


def _reasoning_item(request: ChatRequest, result: ChatResult) -> dict:
    text = result.reasoning.text
    # vLLM has no reasoning summaries: the full text serves as the summary and as the raw content.
    item = {
        "type": "reasoning",
        "id": f"rs_{result.id}",
        "summary": [{"type": "summary_text", "text": text}],
        "content": [{"type": "reasoning_text", "text": text}],
    }
    if _ENCRYPTED in request.metadata.get("include", []):
        item["encrypted_content"] = seal(text)
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


def _echoed_tools(request: ChatRequest) -> list[dict]:
    custom = set(request.metadata.get("custom_tools", []))
    return [
        {"type": "custom", "name": t.name, "description": t.description}
        if t.name in custom
        else {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": False,
        }
        for t in request.tools
    ]


def _response(request: ChatRequest, result: ChatResult, output: list[dict], *, final: bool = True) -> dict:
    """The Response object: finished (`final`) or as first announced on a stream."""
    echo = request.metadata.get("echo", {})
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
        "tools": _echoed_tools(request),
        "top_logprobs": echo.get("top_logprobs", 0),
        "top_p": request.sampling.top_p,
        "truncation": echo.get("truncation", "disabled"),
        "usage": _usage(result) if final else None,
        "user": None,
        "metadata": echo.get("metadata", {}),
    }


def _stream(request: ChatRequest, result: ChatResult) -> bytes:
    output = _output(request, result)
    events: list[dict] = [
        {"type": "response.created", "response": _response(request, result, [], final=False)},
        {"type": "response.in_progress", "response": _response(request, result, [], final=False)},
    ]
    for index, item in enumerate(output):
        events += _item_events(index, item)
    final = _response(request, result, output)
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
        body = [{"type": "response.function_call_arguments.delta", **at, "delta": p} for p in pieces(item["arguments"])]
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
        body = [{"type": "response.custom_tool_call_input.delta", **at, "delta": p} for p in pieces(item["input"])]
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
            {"type": "response.output_text.delta", **here, "delta": p, "logprobs": []} for p in pieces(part["text"])
        ]
        events.append({"type": "response.output_text.done", **here, "text": part["text"], "logprobs": []})
        events.append({"type": "response.content_part.done", **here, "part": part})
    return events


def _reasoning_events(at: dict, item: dict) -> list[dict]:
    events: list[dict] = []
    for si, part in enumerate(item["summary"]):
        here = {**at, "summary_index": si}
        events.append({"type": "response.reasoning_summary_part.added", **here, "part": {**part, "text": ""}})
        events += [{"type": "response.reasoning_summary_text.delta", **here, "delta": p} for p in pieces(part["text"])]
        events.append({"type": "response.reasoning_summary_text.done", **here, "text": part["text"]})
        events.append({"type": "response.reasoning_summary_part.done", **here, "part": part})
    for ci, part in enumerate(item["content"]):
        here = {**at, "content_index": ci}
        events.append({"type": "response.content_part.added", **here, "part": {**part, "text": ""}})
        events += [{"type": "response.reasoning_text.delta", **here, "delta": p} for p in pieces(part["text"])]
        events.append({"type": "response.reasoning_text.done", **here, "text": part["text"]})
        events.append({"type": "response.content_part.done", **here, "part": part})
    return events
