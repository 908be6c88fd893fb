"""Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens.

Requests become one `ChatRequest`; results go back as a `Message` object or as the exact SSE
event sequence the official SDK's accumulator and Claude Code consume. The stream is derived
from the same content blocks as the non-streamed answer, so both shapes always agree.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from polar.canonical import (
    ChatRequest,
    ChatResult,
    ImagePart,
    Message,
    Part,
    Reasoning,
    Sampling,
    TextPart,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
)
from polar.errors import STATUS, GatewayError, invalid, optional, require
from polar.providers.base import HttpReply, Provider, Route, new_id, now, sse_event
from polar.providers.reasoning_seal import seal, sign, unseal

_GENERATE_PATH = "/v1/messages"
_COUNT_PATH = "/v1/messages/count_tokens"

# Keys polar adds to `ChatRequest.metadata` next to the client's own `metadata` fields.
THINKING_DISPLAY_KEY = "anthropic.thinking_display"
SKIPPED_TOOLS_KEY = "anthropic.skipped_tools"

# Characters per streamed delta: small enough that clients really accumulate several deltas.
_TEXT_CHUNK = 64
_JSON_CHUNK = 32

_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "stop_sequence": "stop_sequence",
    "content_filter": "refusal",
}

# kind -> (Anthropic error type, status). Overloaded is 529 on this API, not 503.
_ERRORS: dict[str, tuple[str, int]] = {
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
}

# Claude Code looks for this prefix to decide that a conversation needs compacting.
_CONTEXT_PREFIX = "prompt is too long"

# Blocks of Anthropic-hosted tools (web search, code execution, MCP connector, tool search).
# polar runs no server tools, so their traces in history carry nothing the model can use.
_SERVER_BLOCKS = {"server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload", "tool_reference"}


class AnthropicMessages(Provider):
    name = "anthropic"

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        if method.upper() != "POST":
            return None
        path = path.split("?", 1)[0].rstrip("/")
        if path.endswith(_COUNT_PATH):
            return Route(self, "count_tokens", query=dict(query))
        if path.endswith(_GENERATE_PATH):
            return Route(self, "generate", query=dict(query))
        return None

    def parse(self, route: Route, body: Any) -> ChatRequest:
        if not isinstance(body, dict):
            raise invalid("request body must be a JSON object")
        generate = route.endpoint == "generate"
        max_tokens = require(body, "max_tokens", int) if generate else optional(body, "max_tokens", int)
        if max_tokens is not None and max_tokens < 1:
            raise invalid("field 'max_tokens' must be at least 1", "max_tokens")
        tools, skipped = _parse_tools(optional(body, "tools", list, default=[]))
        choice, parallel = _parse_tool_choice(optional(body, "tool_choice", dict))
        effort, schema = _output_config(body.get("output_config"))
        thinking, display = _parse_thinking(optional(body, "thinking", dict), effort)
        metadata = dict(optional(body, "metadata", dict, default={}))
        if display:
            metadata[THINKING_DISPLAY_KEY] = display
        if skipped:
            metadata[SKIPPED_TOOLS_KEY] = skipped
        return ChatRequest(
            model=require(body, "model", str),
            messages=_parse_system(body.get("system")) + _parse_messages(require(body, "messages", list)),
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=parallel,
            sampling=Sampling(
                max_tokens=max_tokens,
                temperature=optional(body, "temperature", (int, float)),
                top_p=optional(body, "top_p", (int, float)),
                top_k=optional(body, "top_k", int),
                stop=_string_list(optional(body, "stop_sequences", list, default=[]), "stop_sequences"),
            ),
            thinking=thinking,
            stream=generate and optional(body, "stream", bool, default=False),
            response_schema=schema,
            metadata=metadata,
        )

    def render(self, route: Route, request: ChatRequest, result: ChatResult) -> HttpReply:
        message = _message(request, result)
        headers = {"request-id": new_id("req_")}
        if not request.stream:
            return HttpReply.json(message, headers=headers)
        return HttpReply.sse(_stream(message), headers=headers)

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        return HttpReply.json({"input_tokens": input_tokens}, headers={"request-id": new_id("req_")})

    def render_error(self, error: GatewayError) -> HttpReply:
        error_type, status = _ERRORS[error.kind]
        # A status the raiser chose on purpose wins over this API's default for the kind.
        if error.status != STATUS[error.kind]:
            status = error.status
        message = error.message
        if error.kind == "context_length" and not message.startswith(_CONTEXT_PREFIX):
            message = f"{_CONTEXT_PREFIX}: {message}"
        request_id = new_id("req_")
        body = {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}
        return HttpReply.json(body, status=status, headers={"request-id": request_id})

    def render_models(self, models: list[str]) -> HttpReply:
        created = datetime.fromtimestamp(now(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        data = [
            {"type": "model", "id": m, "display_name": m, "created_at": created, "lifecycle": "active"} for m in models
        ]
        return HttpReply.json(
            {
                "data": data,
                "has_more": False,
                "first_id": models[0] if models else None,
                "last_id": models[-1] if models else None,
            }
        )


# ---------------------------------------------------------------------------------------------
# parse


# Claude Code opens its system prompt with an attribution line for Anthropic's billing
# ("x-anthropic-billing-header: cc_version=…; cc_prev_req=req_…; cch=…;"), which Anthropic's API
# takes out of the prompt. Its values change on every request: left in, every turn of a session
# would start with a different prefix, so no turn could continue the previous one's tokens.
_BILLING_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)


def _parse_system(system: Any) -> list[Message]:
    if system is None or system == "":
        return []
    if not isinstance(system, (str, list)):
        raise invalid("field 'system' must be a string or an array of text blocks", "system")
    parts = [_without_billing_line(p) for p in _text_parts(_blocks(system, "system"))]
    parts = [p for p in parts if p is not None]
    return [Message(role="system", content=parts)] if parts else []


def _without_billing_line(part: TextPart) -> TextPart | None:
    """The part without Claude Code's billing line; None when that line was all it held."""
    text = _BILLING_LINE.sub("", part.text)
    if text == part.text:
        return part
    return part.model_copy(update={"text": text}) if text.strip() else None


def _parse_messages(raw: list) -> list[Message]:
    if not raw:
        raise invalid("field 'messages' must contain at least one message", "messages")
    tool_names: dict[str, str] = {}  # tool_use id -> tool name, so results can carry the name
    out: list[Message] = []
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"'{where}' must be an object", where)
        role = require(item, "role", str, f"{where}.")
        blocks = _blocks(require(item, "content", (str, list), f"{where}."), f"{where}.content")
        if role == "user":
            out.extend(_user_messages(blocks, tool_names))
        elif role == "assistant":
            out.append(_assistant_message(blocks, tool_names))
        elif role == "system":
            out.append(Message(role="system", content=_text_parts(blocks)))
        else:
            message = f"field '{where}.role' must be 'user', 'assistant' or 'system', got {role!r}"
            raise invalid(message, f"{where}.role")
    return out


Block = tuple[dict, str]  # a content block and its path in the body, for error messages


def _blocks(content: str | list, where: str) -> list[Block]:
    """Content as a list of typed blocks; a plain string is one text block."""
    if isinstance(content, str):
        return [({"type": "text", "text": content}, where)]
    out = []
    for j, block in enumerate(content):
        path = f"{where}[{j}]"
        if not isinstance(block, dict):
            raise invalid(f"'{path}' must be an object", path)
        require(block, "type", str, f"{path}.")
        out.append((block, path))
    return out


def _is_server_block(kind: str) -> bool:
    return kind in _SERVER_BLOCKS or kind.endswith("_tool_result")


def _text_parts(blocks: list[Block]) -> list[Part]:
    parts: list[Part] = []
    for block, path in blocks:
        if block["type"] != "text":
            raise invalid(f"'{path}' must be a text block, got type {block['type']!r}", f"{path}.type")
        parts.append(TextPart(text=require(block, "text", str, f"{path}.")))
    return parts


def _user_messages(blocks: list[Block], tool_names: dict[str, str]) -> list[Message]:
    """Tool results become tool messages, in order; what is left follows as one user message."""
    results: list[Message] = []
    rest: list[Part] = []
    for block, path in blocks:
        kind = block["type"]
        if kind == "tool_result":
            results.append(_tool_result(block, path, tool_names))
        elif not _is_server_block(kind):
            rest.extend(_user_parts(block, path))
    if rest or not results:
        results.append(Message(role="user", content=rest))
    return results


def _user_parts(block: dict, path: str) -> list[Part]:
    kind = block["type"]
    if kind == "text":
        return [TextPart(text=require(block, "text", str, f"{path}."))]
    if kind == "image":
        return [_image(block, path)]
    if kind == "document":
        return _document(block, path)
    if kind == "search_result":
        return _text_parts(_blocks(require(block, "content", list, f"{path}."), f"{path}.content"))
    raise invalid(f"'{path}' has unsupported content block type {kind!r}", f"{path}.type")


def _image(block: dict, path: str) -> ImagePart:
    where = f"{path}.source."
    source = require(block, "source", dict, f"{path}.")
    kind = require(source, "type", str, where)
    if kind == "base64":
        return ImagePart(media_type=require(source, "media_type", str, where), data=require(source, "data", str, where))
    if kind == "url":
        return ImagePart(url=require(source, "url", str, where))
    raise invalid(f"field '{where}type' must be 'base64' or 'url', got {kind!r}", f"{where}type")


def _document(block: dict, path: str) -> list[Part]:
    where = f"{path}.source."
    source = require(block, "source", dict, f"{path}.")
    kind = require(source, "type", str, where)
    if kind == "text":
        return [TextPart(text=require(source, "data", str, where))]
    if kind == "content":
        content = require(source, "content", (str, list), where)
        return [p for b, p_path in _blocks(content, f"{where}content") for p in _user_parts(b, p_path)]
    # PDFs and files cannot reach a text model. Failing would wedge a harness whose history holds
    # one forever, so the model is told a document was left out instead.
    media = optional(source, "media_type", str, where) or kind
    return [TextPart(text=f"[document omitted: {media} documents are not supported]")]


def _tool_result(block: dict, path: str, tool_names: dict[str, str]) -> Message:
    call_id = require(block, "tool_use_id", str, f"{path}.")
    content = optional(block, "content", (str, list), f"{path}.", default="")
    parts: list[Part] = []
    for item, item_path in _blocks(content, f"{path}.content"):
        if not _is_server_block(item["type"]):
            parts.extend(_user_parts(item, item_path))
    return Message(
        role="tool",
        content=parts,
        tool_call_id=call_id,
        name=tool_names.get(call_id),
        is_error=optional(block, "is_error", bool, f"{path}.", default=False),
    )


def _assistant_message(blocks: list[Block], tool_names: dict[str, str]) -> Message:
    message = Message(role="assistant")
    for block, path in blocks:
        kind = block["type"]
        if kind == "text":
            message.content.append(TextPart(text=require(block, "text", str, f"{path}.")))
        elif kind == "thinking":
            message.reasoning.append(_thinking_block(block, path))
        elif kind == "redacted_thinking":
            message.reasoning.append(Reasoning(text=require(block, "data", str, f"{path}."), redacted=True))
        elif kind == "tool_use":
            call = _tool_use(block, path)
            tool_names[call.id] = call.name
            message.tool_calls.append(call)
        elif not _is_server_block(kind):
            raise invalid(f"'{path}' has unsupported assistant content block type {kind!r}", f"{path}.type")
    return message


def _thinking_block(block: dict, path: str) -> Reasoning:
    text = require(block, "thinking", str, f"{path}.")
    signature = optional(block, "signature", str, f"{path}.")
    # With display "omitted" the client saw no text; the signature polar minted carries it.
    if not text:
        text = unseal(signature) or ""
    return Reasoning(text=text, signature=signature)


def _tool_use(block: dict, path: str) -> ToolCall:
    arguments = optional(block, "input", dict, f"{path}.", default={})
    # The client echoes a parsed object; re-serialise it the way chat templates' tojson does.
    return ToolCall(
        id=require(block, "id", str, f"{path}."),
        name=require(block, "name", str, f"{path}."),
        arguments=json.dumps(arguments, ensure_ascii=False),
    )


def _parse_tools(raw: list) -> tuple[list[Tool], list[str]]:
    """Custom tools, plus the names of Anthropic-hosted/typed tools that polar cannot run."""
    tools: list[Tool] = []
    skipped: list[str] = []
    for k, item in enumerate(raw):
        where = f"tools[{k}]."
        if not isinstance(item, dict):
            raise invalid(f"'tools[{k}]' must be an object", f"tools[{k}]")
        kind = optional(item, "type", str, where)
        if kind not in (None, "custom"):
            skipped.append(item.get("name") if isinstance(item.get("name"), str) else kind)
            continue
        tools.append(
            Tool(
                name=require(item, "name", str, where),
                description=optional(item, "description", str, where),
                parameters=require(item, "input_schema", dict, where),
            )
        )
    return tools, skipped


def _parse_tool_choice(raw: dict | None) -> tuple[ToolChoice, bool | None]:
    if raw is None:
        return ToolChoice(), None
    kind = require(raw, "type", str, "tool_choice.")
    modes = {"auto": "auto", "any": "required", "none": "none", "tool": "tool"}
    if kind not in modes:
        message = f"field 'tool_choice.type' must be one of auto, any, none, tool; got {kind!r}"
        raise invalid(message, "tool_choice.type")
    name = require(raw, "name", str, "tool_choice.") if kind == "tool" else None
    disable = optional(raw, "disable_parallel_tool_use", bool, "tool_choice.")
    return ToolChoice(mode=modes[kind], name=name), None if disable is None else not disable


def _parse_thinking(raw: dict | None, effort: str | None) -> tuple[Thinking, str | None]:
    """The thinking switch and the requested display ("summarized" / "omitted"), if any."""
    if raw is None:
        return Thinking(effort=effort), None
    kind = require(raw, "type", str, "thinking.")
    display = optional(raw, "display", str, "thinking.")
    if kind == "enabled":
        budget = require(raw, "budget_tokens", int, "thinking.")
        return Thinking(enabled=True, budget_tokens=budget, effort=effort), display
    if kind in ("adaptive", "between_tools"):
        return Thinking(enabled=True, effort=effort), display
    if kind == "disabled":
        return Thinking(enabled=False, effort=effort), None
    raise invalid(f"field 'thinking.type' must be enabled, adaptive or disabled; got {kind!r}", "thinking.type")


def _output_config(raw: Any) -> tuple[str | None, dict | None]:
    """Effort and JSON-schema format from `output_config`. Read leniently: it is optional extra."""
    if not isinstance(raw, dict):
        return None, None
    effort = raw.get("effort") if isinstance(raw.get("effort"), str) else None
    fmt = raw.get("format")
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    return effort, schema if isinstance(schema, dict) else None


def _string_list(raw: list, field: str) -> list[str]:
    for k, item in enumerate(raw):
        if not isinstance(item, str):
            raise invalid(f"field '{field}[{k}]' must be a string", f"{field}[{k}]")
    return raw


# ---------------------------------------------------------------------------------------------
# render


def _message(request: ChatRequest, result: ChatResult) -> dict:
    stop_reason = _STOP_REASON[result.finish_reason]
    return {
        "id": f"msg_{result.id}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": _content_blocks(request, result),
        "stop_reason": stop_reason,
        "stop_sequence": result.stop_sequence if stop_reason == "stop_sequence" else None,
        "usage": _usage(result),
    }


def _content_blocks(request: ChatRequest, result: ChatResult) -> list[dict]:
    blocks: list[dict] = []
    reasoning = result.reasoning
    if reasoning is not None and reasoning.redacted:
        blocks.append({"type": "redacted_thinking", "data": reasoning.text})
    elif reasoning is not None and reasoning.text:
        blocks.append(_thinking_out(reasoning, request.metadata.get(THINKING_DISPLAY_KEY) == "omitted"))
    if result.content or not result.tool_calls:
        blocks.append({"type": "text", "text": result.content})
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": _tool_input(call)} for call in result.tool_calls
    )
    return blocks


def _thinking_out(reasoning: Reasoning, omitted: bool) -> dict:
    if omitted:
        # The client gets no text, so the signature must carry it back to polar next turn.
        return {"type": "thinking", "thinking": "", "signature": seal(reasoning.text)}
    return {"type": "thinking", "thinking": reasoning.text, "signature": reasoning.signature or sign(reasoning.text)}


def _tool_input(call: ToolCall) -> dict:
    """Tool input must be an object on this API; anything else is handed over raw."""
    value = call.arguments_obj()
    return value if isinstance(value, dict) else {"_raw": call.arguments}


def _usage(result: ChatResult) -> dict:
    # Anthropic's input_tokens excludes cache reads: total input = input + cache read + cache creation.
    cached = result.usage.cached_tokens
    return {
        "input_tokens": max(result.usage.prompt_tokens - cached, 0),
        "output_tokens": result.usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _stream(message: dict) -> bytes:
    usage = message["usage"]
    opening = {"content": [], "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 0}}
    start = {**message, **opening}
    events = [_event({"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        block_events = _block_events(index, block)
        if index == 0:
            block_events.insert(1, _event({"type": "ping"}))  # right after the first block opens, as the real API does
        events.extend(block_events)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    events.append(_event({"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(_event({"type": "message_stop"}))
    return b"".join(events)


def _block_events(index: int, block: dict) -> list[bytes]:
    """content_block_start (the empty block), its deltas, and content_block_stop."""
    kind = block["type"]
    if kind == "thinking":
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": c} for c in _chunks(block["thinking"], _TEXT_CHUNK)]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "text":
        empty = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": c} for c in _chunks(block["text"], _TEXT_CHUNK)]
    elif kind == "tool_use":
        empty = {**block, "input": {}}
        arguments = json.dumps(block["input"], ensure_ascii=False, separators=(",", ":"))
        # Like the real API: an empty first fragment, then the JSON text in pieces.
        deltas = [{"type": "input_json_delta", "partial_json": c} for c in ["", *_chunks(arguments, _JSON_CHUNK)]]
    else:  # redacted_thinking arrives whole in its start event
        empty, deltas = block, []
    start = _event({"type": "content_block_start", "index": index, "content_block": empty})
    body = [_event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
    return [start, *body, _event({"type": "content_block_stop", "index": index})]


def _event(data: dict) -> bytes:
    return sse_event(data, event=data["type"])


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]
